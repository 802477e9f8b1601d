#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def flatten(nested):
    out = []
    for x in nested:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
EOF
