#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def caesar_cipher(text, shift):
    out = []
    for c in text:
        if 'a' <= c <= 'z':
            out.append(chr((ord(c) - 97 + shift) % 26 + 97))
        elif 'A' <= c <= 'Z':
            out.append(chr((ord(c) - 65 + shift) % 26 + 65))
        else:
            out.append(c)
    return ''.join(out)
EOF
