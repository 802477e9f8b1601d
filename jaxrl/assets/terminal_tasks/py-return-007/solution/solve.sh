#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def level():\n    return 610\n' > /app/solution.py
