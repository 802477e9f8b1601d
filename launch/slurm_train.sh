#!/usr/bin/env bash
# Multi-host jaxrl training on a SLURM GPU cluster when the rollout engines run in a separate job
# (launch/slurm_vllm_sidecars.sh); launch/slurm_job.sh runs both roles in one job instead.
# One JAX process per node, all its GPUs local; the mesh covers nodes x GPUs-per-node devices
# (configs/rloo.py:qwen3_8b sets mesh data=-1, fsdp=8: 2 GH200 nodes of 4 GPUs, or 1 node of 8).
#
#   sbatch --nodes=2 [--gpus-per-node=G] launch/slurm_train.sh WORKDIR MODEL_DIR DATASET SIDECAR_URLS [--config.key=value ...]
#
#   WORKDIR       run directory on a shared filesystem (checkpoints, logs, WORKDIR/sync for weights)
#   MODEL_DIR     HF checkpoint of Qwen3-8B (config.json + *.safetensors + tokenizer files)
#   DATASET       JSONL/Parquet prompts (see jaxrl/envs/datasets.py)
#   SIDECAR_URLS  comma-separated base URLs of the vLLM sidecars, e.g. http://node7:8000,http://node8:8000
# The node shape is sbatch's: --gpus-per-node (default 4 below, GH200; 8 for H100/H200 boxes).
# Environment: RECIPE (default configs/rloo.py:qwen3_8b), JAXRL_TOKEN_FILE (shared token, default
# WORKDIR/.sidecar_token, must be the file the sidecars were started with), JAX_COORDINATOR_PORT,
# JAXRL_REPO (the repository, when sbatch is not run from its root: sbatch runs a spooled copy).
#
# Rerunning the same command resumes from the latest committed checkpoint in WORKDIR.
# Before a first run, check the memory plan: python -m jaxrl.plan --config=$RECIPE --num_devices=8.
#SBATCH --job-name=jaxrl-train
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail

if [[ $# -lt 4 ]]; then
  echo "usage: sbatch --nodes=N $0 WORKDIR MODEL_DIR DATASET SIDECAR_URLS [--config.key=value ...]" >&2
  exit 2
fi
WORKDIR=$1; MODEL_DIR=$2; DATASET=$3; SIDECAR_URLS=$4; shift 4
RECIPE=${RECIPE:-configs/rloo.py:qwen3_8b}
REPO_ROOT=""
for c in "${JAXRL_REPO:-}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null && pwd)" "${SLURM_SUBMIT_DIR:-}"; do
  if [[ -n $c && -f $c/jaxrl/__init__.py ]]; then REPO_ROOT=$(cd "$c" && pwd); break; fi
done
if [[ -z $REPO_ROOT ]]; then
  echo "slurm_train.sh: error: cannot find the jaxrl repository: run sbatch from its root or set JAXRL_REPO" >&2
  exit 2
fi
mkdir -p "$WORKDIR"
TOKEN_FILE=${JAXRL_TOKEN_FILE:-$WORKDIR/.sidecar_token}

mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")  # no pipe into head: pipefail
COORD_HOST=${HOSTS[0]}
COORD_PORT=${JAX_COORDINATOR_PORT:-$((SLURM_JOB_ID % 4096 + 61440))}
URL_TUPLE="($(echo "$SIDECAR_URLS" | sed "s/[^,][^,]*/'&'/g"),)"

# XLA GPU flags validated for jaxlib 0.10/0.11; an unknown flag aborts XLA.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
# The trainer's share of each GPU is trainer.gpu_memory_fraction (jaxrl.main sets XLA_PYTHON_CLIENT_MEM_FRACTION).
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export JAXRL_COORDINATOR_ADDRESS="$COORD_HOST:$COORD_PORT"
export JAXRL_NUM_PROCESSES=$SLURM_NNODES
cd "$REPO_ROOT"

# --kill-on-bad-exit: one process dying ends the others (they would wait in collectives).
srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
  bash -c 'export JAXRL_PROCESS_ID=$SLURM_PROCID; exec python -m jaxrl.main "$@"' jaxrl-trainer \
  --config="$RECIPE" --workdir="$WORKDIR" --config.model.path="$MODEL_DIR" --config.data.dataset_path="$DATASET" \
  --config.generator.sidecar_urls="$URL_TUPLE" --config.generator.token_file="$TOKEN_FILE" "$@"
