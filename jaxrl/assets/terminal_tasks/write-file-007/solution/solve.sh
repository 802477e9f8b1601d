#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo zesty > /app/message.txt
