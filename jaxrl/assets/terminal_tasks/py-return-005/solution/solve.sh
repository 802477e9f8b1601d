#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def total():\n    return 913\n' > /app/solution.py
