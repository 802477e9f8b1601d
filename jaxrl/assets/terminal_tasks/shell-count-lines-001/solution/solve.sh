#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
wc -l < /app/data.txt > /app/count.txt
