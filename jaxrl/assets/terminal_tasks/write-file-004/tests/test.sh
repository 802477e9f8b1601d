#!/bin/bash
# Verifier: reward 1 only if /app/data.txt contains exactly the word blaze.
mkdir -p /logs/verifier
if [ -f /app/data.txt ] && [ "$(cat /app/data.txt)" = "blaze" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
