#!/usr/bin/env bash
# The rollout engines of one node (started by launch/slurm_job.sh, one srun task per rollout node):
# GPUS / TP engines, engine e on GPUs [e*TP, (e+1)*TP) of the node and on port PORT + e, bound to
# the node's address. A JAX engine that exits is restarted (it loads the newest published policy
# version on start) up to --restarts times; an engine out of restarts makes this script stop the
# node's other engines and exit 1, which ends the srun step (--kill-on-bad-exit) and the job.
# SIGTERM stops every engine of the node and exits 0.
#
#   rollout_node.sh --engine=vllm|jax --gpus=G --tp=K --port=P --model=DIR --sync-dir=DIR
#       --token-file=FILE --log-dir=DIR [--restarts=R] [--host-suffix=S] [--platform=gpu|cpu]
#       [--venv=DIR] [-- extra engine arguments...]
#
# The node's address is SLURMD_NODENAME (the name in SLURM_JOB_NODELIST, as the job script used
# for the URLs) plus --host-suffix. Engine logs: LOG_DIR/engine_<node>_<port>.log.
set -uo pipefail
PROG=rollout_node.sh
die() { echo "$PROG: error: $*" >&2; exit 2; }

ENGINE=""; GPUS=""; TP=1; PORT=""; MODEL=""; SYNC_DIR=""; TOKEN_FILE=""; LOG_DIR=""; RESTARTS=0
HOST_SUFFIX=""; PLATFORM=gpu; VENV=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --) shift; break ;;
    --engine=*) ENGINE=${1#*=} ;;
    --gpus=*) GPUS=${1#*=} ;;
    --tp=*) TP=${1#*=} ;;
    --port=*) PORT=${1#*=} ;;
    --model=*) MODEL=${1#*=} ;;
    --sync-dir=*) SYNC_DIR=${1#*=} ;;
    --token-file=*) TOKEN_FILE=${1#*=} ;;
    --log-dir=*) LOG_DIR=${1#*=} ;;
    --restarts=*) RESTARTS=${1#*=} ;;
    --host-suffix=*) HOST_SUFFIX=${1#*=} ;;
    --platform=*) PLATFORM=${1#*=} ;;
    --venv=*) VENV=${1#*=} ;;
    *) die "unknown argument $1" ;;
  esac
  shift
done
EXTRA=("$@")
for v in ENGINE GPUS PORT MODEL SYNC_DIR TOKEN_FILE LOG_DIR; do [[ -n ${!v} ]] || die "missing --$(echo "$v" | tr 'A-Z_' 'a-z-')"; done
[[ $ENGINE == vllm || $ENGINE == jax ]] || die "--engine=$ENGINE: use vllm or jax"
(( TP >= 1 && GPUS % TP == 0 )) || die "--tp=$TP must divide --gpus=$GPUS"
NODE=${SLURMD_NODENAME:-$(hostname)}
HOST=$NODE$HOST_SUFFIX
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n $VENV ]]; then
  # shellcheck disable=SC1091
  source "$VENV/bin/activate" || die "cannot activate --venv=$VENV"
fi
mkdir -p "$LOG_DIR"

# The node's GPU ids: SLURM's CUDA_VISIBLE_DEVICES for this step when set, else 0..G-1.
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  IFS=, read -ra NODE_GPUS <<< "$CUDA_VISIBLE_DEVICES"
else
  NODE_GPUS=(); for ((g = 0; g < GPUS; g++)); do NODE_GPUS+=("$g"); done
fi
(( ${#NODE_GPUS[@]} >= GPUS )) || die "node $NODE has GPUs ${NODE_GPUS[*]} (CUDA_VISIBLE_DEVICES), fewer than --gpus=$GPUS"
E=$((GPUS / TP))

engine_cmd() {  # $1 = engine index; sets CMD, CMD_ENV and DEVS (its GPU ids)
  local e=$1 port=$((PORT + $1))
  DEVS=$(IFS=,; echo "${NODE_GPUS[*]:e*TP:TP}")
  CMD_ENV=("CUDA_VISIBLE_DEVICES=$DEVS")
  if [[ $ENGINE == jax ]]; then
    local dtype=bfloat16
    if [[ $PLATFORM == cpu ]]; then CMD_ENV=("JAX_PLATFORMS=cpu" "XLA_FLAGS="); dtype=float32; fi
    CMD=(python -m jaxrl.rollout.sidecar --checkpoint "$MODEL" --host "$HOST" --port "$port" --sync-dir "$SYNC_DIR"
         --token-file "$TOKEN_FILE" --resume-latest --exit-with-parent --dtype "$dtype" "${EXTRA[@]}")
  else
    CMD_ENV+=("JAXRL_SIDECAR_HOST=$HOST" "JAXRL_TOKEN_FILE=$TOKEN_FILE")
    CMD=(bash "$REPO/launch/vllm_sidecar.sh" "$MODEL" "$port" "$SYNC_DIR" --tensor-parallel-size "$TP" "${EXTRA[@]}")
  fi
}

supervise() {  # $1 = engine index; runs in a subshell; returns 1 when out of restarts
  local e=$1 port=$((PORT + $1)) n=0 child="" rc
  local log="$LOG_DIR/engine_${NODE}_${port}.log"
  trap '[[ -n $child ]] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 0' TERM
  engine_cmd "$e"
  while true; do
    echo "$PROG: $NODE: engine $e on http://$HOST:$port (GPUs $DEVS), log $log" >&2
    env "${CMD_ENV[@]}" "${CMD[@]}" >> "$log" 2>&1 &
    child=$!
    wait "$child"; rc=$?; child=""
    if (( n >= RESTARTS )); then
      echo "$PROG: $NODE: engine $e (http://$HOST:$port) exited with code $rc and has no restarts left (--engine-restarts=$RESTARTS); last lines of $log:" >&2
      tail -n 20 "$log" | sed "s/^/  | /" >&2
      return 1
    fi
    n=$((n + 1))
    echo "$PROG: $NODE: engine $e (http://$HOST:$port) exited with code $rc; restarting it ($n of $RESTARTS)" >&2
    sleep 2
  done
}

SUP=()
stop_all() {
  local p
  for p in "${SUP[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${SUP[@]}"; do wait "$p" 2>/dev/null; done
}
trap 'stop_all; exit 0' TERM INT HUP

for ((e = 0; e < E; e++)); do
  supervise "$e" &
  SUP+=($!)
done
while true; do
  for p in "${SUP[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p"; rc=$?
      if (( rc != 0 )); then
        echo "$PROG: $NODE: stopping the node's engines" >&2
        stop_all
        exit 1
      fi
    fi
  done
  sleep 1
done
