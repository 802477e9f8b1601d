#!/bin/bash
# Verifier: reward 1 only if /app/notes.txt contains exactly the word delta.
mkdir -p /logs/verifier
if [ -f /app/notes.txt ] && [ "$(cat /app/notes.txt)" = "delta" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
