#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo pine > /app/item.txt
