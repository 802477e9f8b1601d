#!/bin/bash
# Verifier: reward 1 only if /app/count.txt holds 9.
mkdir -p /logs/verifier
if [ -f /app/count.txt ] && [ "$(tr -d " \n" < /app/count.txt)" = "9" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
