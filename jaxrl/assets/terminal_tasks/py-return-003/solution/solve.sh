#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf 'def base_value():\n    return 649\n' > /app/solution.py
