#!/bin/bash
# Verifier: reward 1 only if /app/message.txt contains exactly the word flint.
mkdir -p /logs/verifier
if [ -f /app/message.txt ] && [ "$(cat /app/message.txt)" = "flint" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
