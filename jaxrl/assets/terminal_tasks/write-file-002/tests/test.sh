#!/bin/bash
# Verifier: reward 1 only if /app/token.txt contains exactly the word toast.
mkdir -p /logs/verifier
if [ -f /app/token.txt ] && [ "$(cat /app/token.txt)" = "toast" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
