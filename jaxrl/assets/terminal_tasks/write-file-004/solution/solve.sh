#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo kayak > /app/value.txt
