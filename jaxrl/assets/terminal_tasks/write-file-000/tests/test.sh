#!/bin/bash
# Verifier: reward 1 only if /app/message.txt contains exactly the word wren.
mkdir -p /logs/verifier
if [ -f /app/message.txt ] && [ "$(cat /app/message.txt)" = "wren" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
