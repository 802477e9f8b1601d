#!/bin/bash
# Verifier: reward 1 only if /app/output.txt contains exactly the word flint.
mkdir -p /logs/verifier
if [ -f /app/output.txt ] && [ "$(cat /app/output.txt)" = "flint" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
