#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
sort /app/words.txt > /app/sorted.txt
