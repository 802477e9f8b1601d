#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo harbor > /app/item.txt
