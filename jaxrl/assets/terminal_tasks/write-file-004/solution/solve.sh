#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo blaze > /app/data.txt
