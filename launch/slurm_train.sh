#!/usr/bin/env bash
# Multi-host jaxrl training on a SLURM GPU cluster (H100/H200/GH200 nodes, 8 GPUs each):
# one JAX process per node, all its GPUs local; the mesh is data = nodes x fsdp = 8
# (configs/rloo.py:qwen3_8b sets mesh data=-1, fsdp=8). Rollouts come from vLLM sidecars
# started beforehand with launch/slurm_vllm_sidecars.sh.
#
#   sbatch --nodes=2 launch/slurm_train.sh WORKDIR MODEL_DIR DATASET SIDECAR_URLS [--config.key=value ...]
#
#   WORKDIR       run directory on a shared filesystem (checkpoints, logs, WORKDIR/sync for weights)
#   MODEL_DIR     HF checkpoint of Qwen3-8B (config.json + *.safetensors + tokenizer files)
#   DATASET       JSONL/Parquet prompts (see jaxrl/envs/datasets.py)
#   SIDECAR_URLS  comma-separated base URLs of the vLLM sidecars, e.g. http://node7:8000,http://node8:8000
# Environment: RECIPE (default configs/rloo.py:qwen3_8b), JAXRL_TOKEN_FILE (shared token, default
# WORKDIR/.sidecar_token, must be the file the sidecars were started with), JAX_COORDINATOR_PORT.
#
# Rerunning the same command resumes from the latest committed checkpoint in WORKDIR.
# Before a first run, check the memory plan: python -m jaxrl.plan --config=$RECIPE --num_devices=16.
#SBATCH --job-name=jaxrl-train
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail

if [[ $# -lt 4 ]]; then
  echo "usage: sbatch --nodes=N $0 WORKDIR MODEL_DIR DATASET SIDECAR_URLS [--config.key=value ...]" >&2
  exit 2
fi
WORKDIR=$1; MODEL_DIR=$2; DATASET=$3; SIDECAR_URLS=$4; shift 4
RECIPE=${RECIPE:-configs/rloo.py:qwen3_8b}
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$WORKDIR"
TOKEN_FILE=${JAXRL_TOKEN_FILE:-$WORKDIR/.sidecar_token}

COORD_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
COORD_PORT=${JAX_COORDINATOR_PORT:-$((SLURM_JOB_ID % 4096 + 61440))}
URL_TUPLE="($(echo "$SIDECAR_URLS" | sed "s/[^,][^,]*/'&'/g"),)"

# XLA GPU flags validated for jaxlib 0.10/0.11 (qwen3_vllm.md §6); an unknown flag aborts XLA.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}

srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 bash -c "
  cd '$REPO_ROOT'
  export JAXRL_COORDINATOR_ADDRESS='$COORD_HOST:$COORD_PORT'
  export JAXRL_NUM_PROCESSES=\$SLURM_NTASKS
  export JAXRL_PROCESS_ID=\$SLURM_PROCID
  exec python -m jaxrl.main --config='$RECIPE' --workdir='$WORKDIR' \
    --config.model.path='$MODEL_DIR' --config.data.dataset_path='$DATASET' \
    --config.generator.sidecar_urls=\"$URL_TUPLE\" --config.generator.token_file='$TOKEN_FILE' $*
"
