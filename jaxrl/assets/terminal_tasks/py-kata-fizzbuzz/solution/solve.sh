#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')
        out.append(s or str(i))
    return out
EOF
