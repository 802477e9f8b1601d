#!/bin/bash
# Verifier: reward 1 only if /app/total.txt holds 3512.
mkdir -p /logs/verifier
if [ -f /app/total.txt ] && [ "$(tr -d " \n" < /app/total.txt)" = "3512" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
