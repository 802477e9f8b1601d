#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
sort -u /app/items.txt | wc -l > /app/unique.txt
