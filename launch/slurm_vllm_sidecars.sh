#!/usr/bin/env bash
# vLLM rollout sidecars for a jaxrl run, one per node (tensor-parallel over the node's GPUs).
#
#   sbatch --nodes=2 launch/slurm_vllm_sidecars.sh MODEL_DIR WORKDIR [PORT] [vllm serve args...]
#
# On each node launch/vllm_sidecar.sh starts vLLM bound to loopback and the jaxrl front on the node's
# address (PORT, default 8000): the front is the only thing the trainer nodes can reach; it needs the
# shared token in WORKDIR/.sidecar_token (created here if missing) on every route but /health, and
# loads only policy versions the trainer publishes in WORKDIR/sync (shared filesystem). Pass the
# printed URLs to launch/slurm_train.sh.
# Environment passed through to every node: JAXRL_VLLM_LOGPROBS_MODE (processed_logprobs | raw_logprobs,
# see docs/sidecar.md "vLLM sidecars: logprobs and security"), JAXRL_GPU_MEMORY_UTILIZATION (default 0.85), JAXRL_PYTHON.
#SBATCH --job-name=jaxrl-vllm
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: sbatch --nodes=N $0 MODEL_DIR WORKDIR [PORT] [vllm serve args...]" >&2
  exit 2
fi
MODEL_DIR=$1; WORKDIR=$2; PORT=${3:-8000}; shift $(( $# >= 3 ? 3 : 2 ))
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$WORKDIR/sync"
TOKEN_FILE=$WORKDIR/.sidecar_token
if [[ ! -s $TOKEN_FILE ]]; then
  (umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' > "$TOKEN_FILE")
fi
for h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do echo "sidecar: http://$h:$PORT"; done
srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 --export=ALL bash -c "
  export JAXRL_SIDECAR_HOST=\$(hostname -f)
  export JAXRL_TOKEN_FILE='$TOKEN_FILE'
  exec '$REPO_ROOT/launch/vllm_sidecar.sh' '$MODEL_DIR' '$PORT' '$WORKDIR/sync' --tensor-parallel-size 8 $*
"
