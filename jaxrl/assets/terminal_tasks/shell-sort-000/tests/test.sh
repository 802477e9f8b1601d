#!/bin/bash
# Verifier: reward 1 only if /app/sorted.txt holds the sorted words.
mkdir -p /logs/verifier
if [ -f /app/sorted.txt ] && [ "$(cat /app/sorted.txt)" = "$(printf 'aspen\nbirch\ncoral\nember\nharbor\nkoala\nraven\ntoast\ntulip\nyodel')" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
