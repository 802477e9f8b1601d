#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def answer():\n    return 253\n' > /app/solution.py
