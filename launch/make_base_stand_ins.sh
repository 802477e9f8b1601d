#!/usr/bin/env bash
# Local stand-ins for the base images public Harbor tasks name, for machines that reach Debian's mirror and
# PyPI but no container registry (the image backend, docs/terminal_tasks.md "Local base images").
#
#   launch/make_base_stand_ins.sh [--uv VERSION]...
#
# Makes, with buildah (each once; a rerun skips what exists):
#   localhost/debian-stand-in:bookworm   Debian 12 minbase + ca-certificates (mmdebstrap; for ubuntu:*, debian:*),
#                                        trusting the host's extra CAs (/usr/local/share/ca-certificates)
#   localhost/python-stand-in:bookworm   the above + python3 (3.11), pip, venv; `python`/`pip` on PATH and no
#                                        PEP 668 marker, as the python:3.x-slim images (for python:3.*-slim)
#   localhost/uv-stand-in:VERSION        FROM scratch with /uv and /uvx from PyPI's `uv==VERSION` wheel, the
#                                        layout of ghcr.io/astral-sh/uv:VERSION (for COPY --from=...uv:VERSION)
# and prints the --base-image mappings to pass to `python -m jaxrl.tasks` (or harbor.base_images).
# The Debian root filesystem tar is kept in ${JAXRL_IMAGE_CACHE:-~/.cache/jaxrl/images}/.
# The stand-ins are not the named images: python is Debian's 3.11, not 3.12; say so when reporting results.
set -euo pipefail
uv_versions=()
while [ $# -gt 0 ]; do
  case "$1" in
    --uv) [ $# -ge 2 ] || { echo "make_base_stand_ins.sh: --uv needs a version (e.g. --uv 0.8.15)" >&2; exit 2; }
          uv_versions+=("$2"); shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "make_base_stand_ins.sh: unknown argument '$1' (use --uv VERSION)" >&2; exit 2 ;;
  esac
done
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || { echo "make_base_stand_ins.sh: $tool is missing: apt-get install -y buildah mmdebstrap" >&2; exit 1; }
done
cache="${JAXRL_IMAGE_CACHE:-$HOME/.cache/jaxrl/images}"
mkdir -p "$cache"
have() { buildah inspect --type image "$1" >/dev/null 2>&1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

debian=localhost/debian-stand-in:bookworm
if ! have "$debian"; then
  tar="$cache/debian-bookworm-minbase.tar"
  if [ ! -f "$tar" ]; then
    mmdebstrap --format=tar --variant=minbase --include=ca-certificates bookworm "$tar.part" >&2
    mv "$tar.part" "$tar"
  fi
  c=$(buildah from scratch)
  buildah add "$c" "$tar" / >/dev/null
  # The host's own extra CAs (e.g. an egress proxy's): TLS clients in the builds (uv, curl) trust what the
  # host trusts. apt-get's update-ca-certificates keeps them when a build reinstalls ca-certificates.
  if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    buildah add "$c" /usr/local/share/ca-certificates/ /usr/local/share/ca-certificates/ >/dev/null
    buildah run --isolation chroot "$c" -- update-ca-certificates >/dev/null
  fi
  buildah commit -q "$c" "$debian" >/dev/null
  buildah rm "$c" >/dev/null
fi

python=localhost/python-stand-in:bookworm
if ! have "$python"; then
  cat > "$work/Dockerfile" <<EOF
FROM $debian
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \\
    && rm -rf /var/lib/apt/lists/* && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \\
    && ln -s /usr/bin/python3 /usr/local/bin/python && ln -s /usr/bin/pip3 /usr/local/bin/pip
EOF
  buildah bud -q --isolation chroot -t "$python" "$work" >/dev/null
fi

for v in "${uv_versions[@]}"; do
  uv="localhost/uv-stand-in:$v"
  have "$uv" && continue
  mkdir -p "$work/uv-$v"
  "$(dirname "$0")/uv_from_pypi.sh" "$v" "$work/uv-$v"
  printf 'FROM scratch\nCOPY uv uvx /\n' > "$work/uv-$v/Dockerfile"
  buildah bud -q --isolation chroot -t "$uv" "$work/uv-$v" >/dev/null
done

echo "--base-image ubuntu:24.04=$debian --base-image python:3.12-slim=$python --base-image python:3.11-slim=$python" \
     $(for v in "${uv_versions[@]}"; do printf -- '--base-image ghcr.io/astral-sh/uv:%s=localhost/uv-stand-in:%s ' "$v" "$v"; done)
