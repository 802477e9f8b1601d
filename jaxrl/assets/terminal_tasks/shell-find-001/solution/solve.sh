#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
grep -l needle /app/docs/* | xargs -n1 basename > /app/answer.txt
