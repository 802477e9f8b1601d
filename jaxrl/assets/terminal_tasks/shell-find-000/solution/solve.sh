#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
grep -l marker /app/docs/* | xargs -n1 basename > /app/answer.txt
