#!/bin/bash
# Verifier: reward 1 only if /app/answer.txt contains exactly the word yodel.
mkdir -p /logs/verifier
if [ -f /app/answer.txt ] && [ "$(cat /app/answer.txt)" = "yodel" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
