#!/bin/bash
# Verifier: reward 1 only if /app/item.txt contains exactly the word pine.
mkdir -p /logs/verifier
if [ -f /app/item.txt ] && [ "$(cat /app/item.txt)" = "pine" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
