#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def offset():\n    return 597\n' > /app/solution.py
