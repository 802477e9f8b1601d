#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def score():\n    return 631\n' > /app/solution.py
