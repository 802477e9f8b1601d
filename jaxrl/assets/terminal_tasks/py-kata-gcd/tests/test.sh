#!/bin/bash
# Verifier: reward 1 only if the tests in /tests/test_solution.py pass against /app.
mkdir -p /logs/verifier
cd /app
python3 -m pytest -q -p no:cacheprovider /tests/test_solution.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
