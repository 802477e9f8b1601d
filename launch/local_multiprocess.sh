#!/usr/bin/env bash
# Run jaxrl as N local JAX processes (N x 2 fake CPU devices) — the multi-host code path on one
# machine, for testing launch changes without a cluster.
#
#   launch/local_multiprocess.sh N WORKDIR [--config.key=value ...]
set -euo pipefail
if [[ $# -lt 2 ]]; then echo "usage: $0 N WORKDIR [--config.key=value ...]" >&2; exit 2; fi
N=$1; WORKDIR=$2; shift 2
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((i = 0; i < N; i++)); do
  (cd "$REPO_ROOT" && JAXRL_COORDINATOR_ADDRESS=127.0.0.1:$PORT JAXRL_NUM_PROCESSES=$N JAXRL_PROCESS_ID=$i \
    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    python -m jaxrl.main --config="${RECIPE:-configs/rloo.py}" --workdir="$WORKDIR" "$@") &
  pids+=($!)
done
# SIGTERM / SIGINT to this script reach every process (each one cleans up and says how to resume).
forward() { kill -"$1" "${pids[@]}" 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
status=0
for p in "${pids[@]}"; do
  while :; do
    rc=0; wait "$p" || rc=$?
    kill -0 "$p" 2>/dev/null || break  # wait returns early when a trapped signal arrives
  done
  [[ $rc -ne 0 ]] && status=$rc
done
exit $status
