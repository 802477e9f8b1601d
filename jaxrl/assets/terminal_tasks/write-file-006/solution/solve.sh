#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo lilac > /app/record.txt
