#!/bin/bash
# Verifier: reward 1 only if /app/reply.txt contains exactly the word glade.
mkdir -p /logs/verifier
if [ -f /app/reply.txt ] && [ "$(cat /app/reply.txt)" = "glade" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
