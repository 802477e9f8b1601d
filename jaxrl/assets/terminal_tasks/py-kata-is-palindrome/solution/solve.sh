#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def is_palindrome(text):
    s = [c.lower() for c in text if c.isalnum()]
    return s == s[::-1]
EOF
