#!/bin/bash
# Verifier: reward 1 only if /app/value.txt contains exactly the word kayak.
mkdir -p /logs/verifier
if [ -f /app/value.txt ] && [ "$(cat /app/value.txt)" = "kayak" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
