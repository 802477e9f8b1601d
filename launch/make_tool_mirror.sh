#!/usr/bin/env bash
# A tool mirror: the programs verifiers download at verification time from hosts that are not package
# registries, for trials without network (harbor.tool_mirror / --tool-mirror; docs/terminal_tasks.md "Network").
#
#   launch/make_tool_mirror.sh DIR --uv VERSION
#
# Puts uv and uvx (PyPI's uv==VERSION wheel, the binaries astral.sh's installer fetches) in DIR/bin. A trial
# binds DIR read-only at /opt/jaxrl-tools while test.sh runs and ends the verifier's PATH with its bin/: a
# verifier's `curl -LsSf https://astral.sh/uv/VERSION/install.sh | sh` fails without network, and its next
# `uvx ...` finds this uv (then installs packages from --pip-mirror). Use the VERSION the verifiers name.
set -euo pipefail
dir=""; uv=""
while [ $# -gt 0 ]; do
  case "$1" in
    --uv) [ $# -ge 2 ] || { echo "make_tool_mirror.sh: --uv needs a version (e.g. --uv 0.9.7)" >&2; exit 2; }
          uv="$2"; shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    -*) echo "make_tool_mirror.sh: unknown argument '$1' (use DIR --uv VERSION)" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "make_tool_mirror.sh: one DIR only (got '$dir' and '$1')" >&2; exit 2; }
       dir="$1"; shift ;;
  esac
done
[ -n "$dir" ] && [ -n "$uv" ] || { echo "make_tool_mirror.sh: usage: make_tool_mirror.sh DIR --uv VERSION" >&2; exit 2; }
[ -e "$dir" ] && [ ! -d "$dir" ] && { echo "make_tool_mirror.sh: $dir is a file, not a folder: pass a folder" >&2; exit 2; }
new_dir=0; [ -e "$dir" ] || new_dir=1
if ! "$(dirname "$0")/uv_from_pypi.sh" "$uv" "$dir/bin"; then
  [ "$new_dir" = 1 ] && rm -rf "$dir"   # leave nothing a later --tool-mirror would accept
  exit 1
fi
echo "$dir"
