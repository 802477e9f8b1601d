#!/bin/bash
# Verifier: reward 1 only if /app/greet.sh is executable and prints the greeting.
mkdir -p /logs/verifier
if [ -x /app/greet.sh ] && [ "$(cd /tmp && /app/greet.sh)" = "Hello, Peggy!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
