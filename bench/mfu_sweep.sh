#!/usr/bin/env bash
# One-call GPU sweep of the train step's MFU (bench/train_step_mfu.py), sized for at most 3.5 minutes
# (BUDGET_S=205) of wall time on one H200, compiles included, most important runs first. Each group is its own
# process (XLA flags and allocator settings are read at start-up) under `timeout`, and each
# process skips the variants that would start after its own deadline; the whole sweep stops
# starting groups after BUDGET_S seconds. Results: OUT_DIR/<group>.json and .log, then one table.
#
#   bash bench/mfu_sweep.sh OUT_DIR            # GPU
#   bash bench/mfu_sweep.sh OUT_DIR --tiny     # CPU smoke run of the same groups (tiny dims)
#
# Groups, in order (what each answers, and which result changes which default: docs/scaling.md,
# "Train-step speed"):
#   main     1.7B B8 x S2048, cuDNN: save_dots_attention with model.logprobs_save_probs (with a
#            kernel-time profile) and without; 8B widths B4 x S4096; the old log-softmax
#            (head=legacy) as an A/B; save_dots with saved probabilities
#   offload  one step per trainer.optimizer.offload mode: memory, time, differences from 'none'
#   cublas   the 1.7B candidate with --xla_gpu_enable_triton_gemm=false
#   more     8B widths B1 x S16384 with save_attention vs full (the 8B recipe's remat); chunk=2048
#   none     1.7B remat none, own process, XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 (needs ~100 GiB)
#   dynslice the 1.7B candidate with --xla_gpu_enable_dynamic_slice_fusion=true
set -u
OUT=${1:?usage: bash bench/mfu_sweep.sh OUT_DIR [--tiny]}
TINY=${2:-}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -n "$TINY" ]; then BUDGET_S=${BUDGET_S:-3600}; SCALE=8; else BUDGET_S=${BUDGET_S:-205}; SCALE=1; fi
mkdir -p "$OUT"
START=$(date +%s)
BEST=cudnn:save_dots_attention
CAND=$BEST:probs=save

# group NAME SECONDS [VAR=VALUE ...] -- bench args...
group() {
  local name=$1 secs=$(( $2 * SCALE )); shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  if [ "$left" -lt 15 ]; then echo "=== $name: skipped (sweep budget spent)"; return; fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "=== $name ($secs s max) ${envs[*]}"
  env "${envs[@]}" timeout -k 5 "$secs" "$PY" "$HERE/train_step_mfu.py" $TINY --deadline-s $(( secs - 3 * SCALE )) \
    --out "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - START )) s of the sweep"
}

group main 95 XLA_FLAGS= -- --profile "$CAND" --variants \
"$CAND,$BEST,cudnn:save_dots_attention:shape=8b_w:batch=4:seq=4096,$BEST:head=legacy,cudnn:save_dots:probs=save"
group offload 40 XLA_FLAGS= -- --checks offload --offload-modes none,moments,moments_and_master --variants ""
group cublas 24 XLA_FLAGS=--xla_gpu_enable_triton_gemm=false -- --variants "$CAND"
group more 46 XLA_FLAGS= -- --variants \
"cudnn:save_attention:shape=8b_w:batch=1:seq=16384,cudnn:full:shape=8b_w:batch=1:seq=16384,$CAND:chunk=2048"
group none 26 XLA_FLAGS= XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 -- --variants cudnn:none:probs=save
group dynslice 24 XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true -- --variants "$CAND"

echo "=== summary ($(( $(date +%s) - START )) s)"
"$PY" "$HERE/train_step_mfu.py" --summarize "$OUT"
