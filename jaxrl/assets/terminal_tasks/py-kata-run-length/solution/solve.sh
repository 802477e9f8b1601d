#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def run_length_encode(text):
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(text[i] + str(j - i))
        i = j
    return ''.join(out)
EOF
