#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def limit():\n    return 684\n' > /app/solution.py
