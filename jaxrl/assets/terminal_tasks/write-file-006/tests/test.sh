#!/bin/bash
# Verifier: reward 1 only if /app/record.txt contains exactly the word lilac.
mkdir -p /logs/verifier
if [ -f /app/record.txt ] && [ "$(cat /app/record.txt)" = "lilac" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
