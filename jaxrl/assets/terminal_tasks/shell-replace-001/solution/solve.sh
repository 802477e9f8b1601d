#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
sed -i 's/waltz/bison/g' /app/config.txt
