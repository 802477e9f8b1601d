#!/bin/bash
# Verifier: reward 1 only if /app/total.txt holds 1352.
mkdir -p /logs/verifier
if [ -f /app/total.txt ] && [ "$(tr -d " \n" < /app/total.txt)" = "1352" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
