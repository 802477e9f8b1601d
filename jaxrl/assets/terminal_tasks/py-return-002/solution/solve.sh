#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def base_value():\n    return 108\n' > /app/solution.py
