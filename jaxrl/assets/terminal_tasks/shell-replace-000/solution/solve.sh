#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
sed -i 's/solar/thorn/g' /app/config.txt
