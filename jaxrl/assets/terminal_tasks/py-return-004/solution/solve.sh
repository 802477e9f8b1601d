#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def magic_number():\n    return 762\n' > /app/solution.py
