#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def compute():\n    return 443\n' > /app/solution.py
