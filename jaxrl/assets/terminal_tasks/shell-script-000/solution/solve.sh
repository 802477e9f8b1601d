#!/bin/bash
# Oracle: the keystrokes of solution/transcript.json as a script.
printf '#!/bin/bash\necho "Hello, Peggy!"\n' > /app/greet.sh
chmod +x /app/greet.sh
