#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo moose > /app/message.txt
