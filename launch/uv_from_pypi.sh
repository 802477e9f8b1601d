#!/usr/bin/env bash
# Puts the uv and uvx programs of PyPI's `uv==VERSION` wheel (manylinux, this machine's architecture) in DIR.
#
#   launch/uv_from_pypi.sh VERSION DIR
#
# PyPI's uv wheel carries the same binaries as astral.sh's installer and the ghcr.io/astral-sh/uv image,
# for machines that reach PyPI but neither astral.sh nor GitHub (make_base_stand_ins.sh, make_tool_mirror.sh).
set -euo pipefail
[ $# -eq 2 ] || { echo "uv_from_pypi.sh: usage: uv_from_pypi.sh VERSION DIR (e.g. 0.9.7 /tmp/tools/bin)" >&2; exit 2; }
version="$1"; dest="$2"
mkdir -p "$dest"
wheel=$(mktemp -d)
trap 'rm -rf "$wheel"' EXIT
pip download -q --no-deps --only-binary=:all: --platform "manylinux_2_17_$(uname -m)" --python-version 3.11 \
    "uv==$version" -d "$wheel" || { echo "uv_from_pypi.sh: cannot download uv==$version from PyPI (is the" \
    "version published? pip index versions uv)" >&2; exit 1; }
python3 - "$wheel" "$dest" <<'EOF'
import pathlib, sys, zipfile
wheel, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
whl = next(wheel.glob("uv-*.whl"))
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        base = name.rsplit("/", 1)[-1]
        if ".data/scripts/" in name and base in ("uv", "uvx"):
            part = dest / (base + ".part")
            part.write_bytes(z.read(name))
            part.chmod(0o755)
            part.replace(dest / base)
missing = [b for b in ("uv", "uvx") if not (dest / b).is_file()]
if missing:
    sys.exit(f"uv_from_pypi.sh: the uv wheel {whl.name} has no {missing}")
EOF
