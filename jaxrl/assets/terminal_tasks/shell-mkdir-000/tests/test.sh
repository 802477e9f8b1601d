#!/bin/bash
# Verifier: reward 1 only if /app/umbra/iris/glade/.keep exists and is empty.
mkdir -p /logs/verifier
if [ -d /app/umbra/iris/glade ] && [ -f /app/umbra/iris/glade/.keep ] && [ ! -s /app/umbra/iris/glade/.keep ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
