#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
mkdir -p /app/umbra/iris/glade && touch /app/umbra/iris/glade/.keep
