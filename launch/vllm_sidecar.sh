#!/usr/bin/env bash
# Start a stock `vllm serve` as a jaxrl rollout sidecar (DESIGN.md §6, qwen3_vllm.md §4).
#
# Usage: launch/vllm_sidecar.sh MODEL_DIR PORT SYNC_DIR [extra `vllm serve` arguments...]
#   MODEL_DIR  HF checkpoint of the initial policy (version 0)
#   PORT       port of the OpenAI-compatible server
#   SYNC_DIR   directory the trainer publishes policy versions to (weight_sync.py); the worker
#              extension refuses to load anything outside it
# Environment:
#   JAXRL_SIDECAR_HOST  bind address (default 127.0.0.1: /collective_rpc is not protected by the API key)
#   JAXRL_TOKEN_FILE    optional file with the shared token; passed as VLLM_API_KEY (guards /v1/*)
#   PYTHONPATH          must let vLLM's workers import jaxrl (this script prepends the repo root)
#
# The trainer talks to it with SidecarClient([url], backend="vllm"): completions on /v1/completions
# with return_token_ids/logprobs=0/ignore_eos, weight loads with /collective_rpc + /reset_prefix_cache.
# Pinned assumptions (vLLM 0.10-0.33): --worker-extension-cls, --generation-config, --logprobs-mode,
# VLLM_SERVER_DEV_MODE routes /collective_rpc and /reset_prefix_cache.
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
mkdir -p "$SYNC_DIR"
export JAXRL_SYNC_DIR="$(cd "$SYNC_DIR" && pwd -P)"
# /collective_rpc (weight loads) and /reset_prefix_cache exist only in dev mode.
export VLLM_SERVER_DEV_MODE=1
if [[ -n "${JAXRL_TOKEN_FILE:-}" ]]; then
  VLLM_API_KEY="$(tr -d '[:space:]' < "$JAXRL_TOKEN_FILE")"
  export VLLM_API_KEY
fi

# --generation-config vllm: ignore the checkpoint's generation_config.json (temperature 0.6,
#   top_k 20, top_p 0.95 for Qwen3), so sampling comes only from our request fields.
# --logprobs-mode processed_logprobs: logprobs after temperature scaling, i.e.
#   log_softmax(logits / T) as in DESIGN.md §3 (raw_logprobs, the default, ignores T). Whether
#   vLLM's processed logprobs are taken before or after top-p/top-k masking is unverified
#   (qwen3_vllm.md §4.2): keep top_p=1, top_k=-1 when comparing them with the trainer's.
exec vllm serve "$MODEL_DIR" \
  --host "${JAXRL_SIDECAR_HOST:-127.0.0.1}" \
  --port "$PORT" \
  --served-model-name policy \
  --dtype bfloat16 \
  --worker-extension-cls jaxrl.rollout.vllm_worker.OrbaxWeightLoader \
  --generation-config vllm \
  --logprobs-mode processed_logprobs \
  "$@"
