#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def gcd(a, b):
    while b:
        a, b = b, a % b
    return a
EOF
