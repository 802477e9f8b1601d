#!/usr/bin/env bash
# A vLLM rollout sidecar: a stock `vllm serve` bound to loopback, and the jaxrl front
# (`python -m jaxrl.rollout.sidecar --backend vllm`) as the only thing on the sidecar's address.
#
# Usage: launch/vllm_sidecar.sh MODEL_DIR PORT SYNC_DIR [extra `vllm serve` arguments...]
#   MODEL_DIR  HF checkpoint of the initial policy (version 0)
#   PORT       port of the jaxrl front (what the trainer's generator.sidecar_urls name)
#   SYNC_DIR   directory the trainer publishes policy versions to; loads from anywhere else are refused
# Environment:
#   JAXRL_TOKEN_FILE          file with the shared token (required unless JAXRL_SIDECAR_HOST is loopback):
#                             the front requires it on every route but /health; vLLM gets it as VLLM_API_KEY
#   JAXRL_SIDECAR_HOST        the front's bind address (default 127.0.0.1; the node's address on a cluster)
#   JAXRL_VLLM_PORT           vLLM's loopback port (default: a free one)
#   JAXRL_VLLM_UDS            optional: a unix socket path for vLLM instead of the loopback port (for nodes
#                             shared with other users; put it in a directory only you can enter)
#   JAXRL_VLLM_LOGPROBS_MODE  processed_logprobs (default) | raw_logprobs: the run's logprob definition
#                             (generator.logprobs_mode) decides; `python -m jaxrl.plan` and the trainer's
#                             error message name the one a run needs
#   JAXRL_GPU_MEMORY_UTILIZATION  vLLM's --gpu-memory-utilization (default 0.85; the share of each GPU it
#                             claims; with a trainer on the same GPUs it must match generator.gpu_memory_utilization)
#   JAXRL_PYTHON              python that runs the front (default python3; needs jaxrl importable, no JAX)
#   JAXRL_VLLM_DEVICE         cpu | cuda (default: cuda when nvidia-smi lists a GPU, else cpu)
#   JAXRL_SIDECAR_STOP_GRACE_S  seconds between the SIGTERM to vLLM and the front and the SIGKILL to what is
#                             left (default 10; a whole number from 1 to 99999)
# The `vllm` on PATH runs vLLM: put the engine environment first (launch/install_engine_env.sh DIR, then
# PATH=DIR/bin:$PATH).
#
# Fitted to the run:
#   * dtype: `--dtype X` among the extra arguments, else config.json's torch_dtype (float32 for the embedded
#     CPU-scale policies, bfloat16 for Qwen3 checkpoints). It must be the run's model.compute_dtype: the
#     front refuses a version published in another dtype (one line naming --dtype), and it sets the
#     tolerance of the front's load probe (jaxrl/rollout/weight_probe.py).
#   * on a CPU: --gpu-memory-utilization 0.3 (there: the share of host memory required free at start)
#     unless JAXRL_GPU_MEMORY_UTILIZATION is set, VLLM_CPU_KVCACHE_SPACE=2 (GiB) unless set, --enforce-eager (start-up 1-2 min instead of compiling), and scheduler settings the CPU
#     engine needs for seeded requests: --max-num-batched-tokens 32768 --max-num-seqs 256
#     --no-async-scheduling (seeded sampling with chunked prefill stops vLLM 0.32's CPU engine with
#     "CPU Generator does not use offset"); each is added only when the extra arguments do not set it.
#   * start-up: the front waits up to JAXRL_VLLM_START_TIMEOUT s (default 1800) for vLLM before it binds
#     PORT; wait for PORT with launch/wait_engines.py (same default).
#
# Security model: vLLM's API key guards only its /v1 routes; /collective_rpc (run any worker method),
# /pause, /reset_prefix_cache, ... are open in VLLM_SERVER_DEV_MODE, which the weight sync needs. So vLLM
# listens on loopback (or a unix socket) only, and the front checks the token, proxies completions, and
# does weight loads itself, only from committed versions inside SYNC_DIR. No front route reaches a worker
# method. If either process exits, the other is stopped and the script exits with its status.
# Pinned assumptions (verified on vllm-cpu 0.32.0 by tests/test_vllm_real.py; CUDA builds and other
# releases unverified): --worker-extension-cls, --generation-config, --logprobs-mode,
# VLLM_SERVER_DEV_MODE routes /collective_rpc and /reset_prefix_cache (/pause, /resume, /weight_info,
# /update_weight_version, /get_world_size are used where present).
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 MODEL_DIR PORT SYNC_DIR [vllm serve args...]" >&2
  exit 2
fi
MODEL_DIR=$1
PORT=$2
SYNC_DIR=$3
shift 3

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
HOST=${JAXRL_SIDECAR_HOST:-127.0.0.1}
MODE=${JAXRL_VLLM_LOGPROBS_MODE:-processed_logprobs}
UTIL=${JAXRL_GPU_MEMORY_UTILIZATION:-0.85}
PYTHON=${JAXRL_PYTHON:-python3}
START_TIMEOUT=${JAXRL_VLLM_START_TIMEOUT:-1800}
STOP_GRACE=${JAXRL_SIDECAR_STOP_GRACE_S:-10}
if ! [[ $STOP_GRACE =~ ^[1-9][0-9]{0,4}$ ]]; then
  echo "error: JAXRL_SIDECAR_STOP_GRACE_S=$STOP_GRACE is not a whole number of seconds from 1 to 99999. Fix: e.g. 10" >&2
  exit 2
fi
if ! command -v vllm >/dev/null 2>&1; then
  echo "error: no \`vllm\` on PATH. Fix: launch/install_engine_env.sh DIR, then run with PATH=DIR/bin:\$PATH" >&2
  exit 2
fi
if [[ ! -f "$MODEL_DIR/config.json" ]]; then
  echo "error: MODEL_DIR $MODEL_DIR has no config.json. Fix: pass an HF checkpoint directory" >&2
  exit 2
fi
has_arg() { local a; for a in "${EXTRA_ARGS[@]}"; do [[ "$a" == "$1" || "$a" == "$1="* ]] && return 0; done; return 1; }
EXTRA_ARGS=("$@")
DTYPE=""
for ((i = 0; i < ${#EXTRA_ARGS[@]}; i++)); do
  case "${EXTRA_ARGS[$i]}" in
    --dtype) DTYPE=${EXTRA_ARGS[$((i + 1))]:-} ;;
    --dtype=*) DTYPE=${EXTRA_ARGS[$i]#--dtype=} ;;
  esac
done
DTYPE_ARGS=()
if [[ -z "$DTYPE" ]]; then
  DTYPE=$("$PYTHON" -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("torch_dtype") or c.get("dtype") or "bfloat16")' "$MODEL_DIR/config.json")
  DTYPE_ARGS=(--dtype "$DTYPE")
fi
case "$DTYPE" in float32|bfloat16) ;; *)
  echo "error: dtype $DTYPE; the jaxrl trainer publishes float32 or bfloat16 (model.compute_dtype): pass --dtype float32 or --dtype bfloat16" >&2
  exit 2;; esac
DEVICE=${JAXRL_VLLM_DEVICE:-}
if [[ -z "$DEVICE" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then DEVICE=cuda; else DEVICE=cpu; fi
fi
DEVICE_ARGS=()
if [[ "$DEVICE" == cpu ]]; then
  # On the CPU build --gpu-memory-utilization is the share of host memory vLLM requires free at start
  # (0.85 refuses to start on a machine shared with a trainer): 0.3 unless set, and a 2 GiB KV cache.
  [[ -n "${JAXRL_GPU_MEMORY_UTILIZATION:-}" ]] || UTIL=0.3
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
  has_arg --enforce-eager || DEVICE_ARGS+=(--enforce-eager)
  has_arg --max-num-batched-tokens || DEVICE_ARGS+=(--max-num-batched-tokens 32768)
  has_arg --max-num-seqs || DEVICE_ARGS+=(--max-num-seqs 256)
  has_arg --no-async-scheduling || has_arg --async-scheduling || DEVICE_ARGS+=(--no-async-scheduling)
fi
case "$MODE" in processed_logprobs|raw_logprobs) ;; *)
  echo "error: JAXRL_VLLM_LOGPROBS_MODE=$MODE; use processed_logprobs or raw_logprobs" >&2; exit 2;; esac

TOKEN_ARGS=()
if [[ -n "${JAXRL_TOKEN_FILE:-}" ]]; then
  VLLM_API_KEY="$(tr -d '[:space:]' < "$JAXRL_TOKEN_FILE")"
  export VLLM_API_KEY
  TOKEN_ARGS=(--token-file "$JAXRL_TOKEN_FILE")
elif [[ "$HOST" != "127.0.0.1" && "$HOST" != "localhost" ]]; then
  echo "error: JAXRL_SIDECAR_HOST=$HOST is not loopback: set JAXRL_TOKEN_FILE (the shared token file)" >&2
  exit 2
fi
# Every check passed: SYNC_DIR is made only now (a refused start leaves nothing behind).
mkdir -p "$SYNC_DIR"
export JAXRL_SYNC_DIR="$(cd "$SYNC_DIR" && pwd -P)"
# Development routes (/collective_rpc, /reset_prefix_cache, /pause, ...) exist only in dev mode.
export VLLM_SERVER_DEV_MODE=1

if [[ -n "${JAXRL_VLLM_UDS:-}" ]]; then
  BIND=(--uds "$JAXRL_VLLM_UDS")
  UPSTREAM="unix:$JAXRL_VLLM_UDS"
else
  # A free loopback port (PORT + 1 would be the next engine's front on a node running several).
  VPORT=${JAXRL_VLLM_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  BIND=(--host 127.0.0.1 --port "$VPORT")
  UPSTREAM="http://127.0.0.1:$VPORT"
fi

# --generation-config vllm: ignore the checkpoint's generation_config.json (Qwen3: temperature 0.6,
#   top_k 20, top_p 0.95), so sampling comes only from the request's fields.
# --logprobs-mode: processed_logprobs = log_softmax after temperature and top-k/top-p (renormalised over
#   the kept set); raw_logprobs = log_softmax of the raw logits (before temperature). jaxrl.rollout.logprob_modes.
# vLLM runs in a process group of its own (setsid: the same PID, which the script waits on): its engine core and
# workers are processes of that group, and stopping the group stops them too. They outlive `vllm serve` when it
# exits first (its EngineCore then sits in a futex wait with SIGTERM caught but never handled: seen on
# vllm-cpu 0.32, 2.5 GB left behind per server).
setsid vllm serve "$MODEL_DIR" "${BIND[@]}" \
  --served-model-name policy \
  "${DTYPE_ARGS[@]}" "${DEVICE_ARGS[@]}" \
  --worker-extension-cls jaxrl.rollout.vllm_worker.OrbaxWeightLoader \
  --generation-config vllm \
  --logprobs-mode "$MODE" \
  --gpu-memory-utilization "$UTIL" \
  "${EXTRA_ARGS[@]}" &
VLLM_PID=$!

"$PYTHON" -m jaxrl.rollout.sidecar --backend vllm --upstream "$UPSTREAM" --vllm-logprobs-mode "$MODE" \
  --gpu-memory-utilization "$UTIL" --host "$HOST" --port "$PORT" --sync-dir "$JAXRL_SYNC_DIR" \
  --model-dir "$MODEL_DIR" --served-dtype "$DTYPE" --upstream-start-timeout "$START_TIMEOUT" \
  --resume-latest --log-level warning "${TOKEN_ARGS[@]}" &
FRONT_PID=$!

# Stopping: SIGTERM to the front and vLLM's process group, then SIGKILL to what is left after STOP_GRACE s
# (10 by default). The front waits for vLLM's
# start-up inside uvicorn's lifespan, where uvicorn holds SIGTERM back until start-up ends (up to
# JAXRL_VLLM_START_TIMEOUT), so without the SIGKILL a vLLM that fails at start, or a scheduler's
# SIGTERM during start-up, would leave the front running on PORT.
stop_children() {
  trap - EXIT INT TERM
  kill -TERM -- "-$VLLM_PID" 2>/dev/null || true  # vLLM's whole group: the server, its engine core, its workers
  kill "$FRONT_PID" 2>/dev/null || true
  local i
  for ((i = 0; i < STOP_GRACE * 5; i++)); do
    kill -0 -- "-$VLLM_PID" 2>/dev/null || kill -0 "$FRONT_PID" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -9 -- "-$VLLM_PID" 2>/dev/null || true
  kill -9 "$FRONT_PID" 2>/dev/null || true
}
trap stop_children EXIT
trap 'stop_children; exit 143' TERM
trap 'stop_children; exit 130' INT
set +e
wait -n
RC=$?
set -e
if ! kill -0 "$VLLM_PID" 2>/dev/null; then who="vllm serve"; else who="the jaxrl front"; fi
echo "vllm_sidecar.sh: $who exited with status $RC; stopping the sidecar" >&2
exit "$RC"
