#!/bin/bash
# Verifier: reward 1 only if /app/answer.txt names zebra.txt.
mkdir -p /logs/verifier
if [ -f /app/answer.txt ] && [ "$(tr -d " \n" < /app/answer.txt)" = "zebra.txt" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
