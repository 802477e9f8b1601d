#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
echo glade > /app/reply.txt
