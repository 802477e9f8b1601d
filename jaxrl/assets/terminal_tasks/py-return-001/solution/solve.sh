#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def offset():\n    return 707\n' > /app/solution.py
