#!/bin/bash
# Verifier: reward 1 only if /app/unique.txt holds 7.
mkdir -p /logs/verifier
if [ -f /app/unique.txt ] && [ "$(tr -d " \n" < /app/unique.txt)" = "7" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
