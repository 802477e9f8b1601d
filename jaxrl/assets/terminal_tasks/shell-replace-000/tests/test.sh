#!/bin/bash
# Verifier: reward 1 only if /app/config.txt has every solar replaced by thorn.
mkdir -p /logs/verifier
if cmp -s /app/config.txt /tests/expected.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
