#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
cat > /app/solution.py << 'EOF'
def merge_intervals(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out
EOF
