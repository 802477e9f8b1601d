#!/usr/bin/env bash
# One SLURM job for a whole jaxrl run, laid out as the seed runs were: of the job's N nodes, the
# first T train (one JAX process per node over its G GPUs, jax.distributed with the coordinator on
# the first training node, so the mesh spans T x G devices) and the other N - T serve rollouts
# (G / ENGINE_TP engines per node, each on its own GPUs and port: with tensor parallel 1, one
# vLLM engine per GPU). The job creates the shared token and the weight-sync directory, waits
# until every engine answers /health, gives the trainer the engines' URLs, and keeps the roles
# running: a trainer that dies is restarted and resumes from its last checkpoint; a JAX engine
# that dies is restarted and loads the newest published policy. A role out of restarts stops the
# whole job with a message naming it; resubmitting the same command resumes the run.
#
#   sbatch --nodes=N [--gpus-per-node=G] launch/slurm_job.sh [options] WORKDIR [--config.key=value ...]
#
# Seed layout, 14 GH200 nodes (4 GPUs each): 2 train (8 devices), 12 x 4 = 48 vLLM engines:
#   sbatch --nodes=14 launch/slurm_job.sh --train-nodes=2 --model=/ckpt/Qwen3-8B \
#       --dataset=/data/prompts.jsonl /scratch/$USER/runs/seed
#
# WORKDIR is the run directory on a filesystem every node shares (checkpoints, logs, WORKDIR/sync
# for the published weights, WORKDIR/.sidecar_token, WORKDIR/logs/ for the engines' logs).
# Arguments after WORKDIR go to `python -m jaxrl.main` (recipe overrides).
#
# Options (before WORKDIR; --name=value):
#   --train-nodes=T         nodes that train (default 2); the remaining nodes run rollout engines
#   --gpus-per-node=G       GPUs per node (default: SLURM_GPUS_PER_NODE, else 4 as on GH200 nodes)
#   --engine=vllm|jax       rollout engine (default vllm); jax = the built-in JAX sidecar
#   --engine-tp=K           GPUs per engine (vLLM --tensor-parallel-size; default 1): G/K engines a node
#   --model=DIR             HF checkpoint of the initial policy (required for vllm; the trainer
#                           gets it as model.path); jax default: the embedded default policy
#   --dataset=FILE          prompt file (data.dataset_path)
#   --recipe=FILE[:scale]   default configs/rloo.py:qwen3_8b
#   --port=P                port of each node's first engine; engine e listens on P + e (default 8100)
#   --coordinator-port=P    jax.distributed coordinator port (default 61440 + job id % 4096)
#   --host-suffix=S         appended to node names to form addresses, e.g. "i" where <node>i names
#                           the InfiniBand interface (JSC's JUWELS/JURECA convention)
#   --platform=gpu|cpu      cpu: a stand-in node whose trainer process has G fake CPU devices (tests)
#   --trainer-restarts=K    trainer restarts before the job stops (default 2)
#   --engine-restarts=K     restarts of each engine (default 2 for jax; vllm supports only 0:
#                           a restarted vLLM would serve the initial checkpoint, not the policy)
#   --engine-timeout=S      seconds to wait for all engines to answer /health (default 1800)
#   --engine-args='ARGS'    extra arguments for every engine (`vllm serve` or the JAX sidecar)
#   --engine-venv=DIR       virtualenv activated on rollout nodes (e.g. one with vLLM, whose torch
#                           pins differ from the trainer's); default: the submitting environment
#
# Run `sbatch` from the repository root (or set JAXRL_REPO): sbatch runs a copy of this script,
# and the roles are started from the repository's launch/ directory on every node.
#SBATCH --job-name=jaxrl
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -uo pipefail

PROG=slurm_job.sh
die() { echo "$PROG: error: $*" >&2; exit 2; }
note() { echo "$PROG [+${SECONDS}s]: $*" >&2; }

# ---- the repository (sbatch runs a copy of this file from its spool directory) ---------------
REPO=""
for c in "${JAXRL_REPO:-}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null && pwd)" "${SLURM_SUBMIT_DIR:-}"; do
  if [[ -n $c && -f $c/jaxrl/__init__.py && -f $c/launch/rollout_node.sh ]]; then REPO=$(cd "$c" && pwd); break; fi
done
[[ -n $REPO ]] || die "cannot find the jaxrl repository: run sbatch from its root directory or set JAXRL_REPO=/path/to/jaxrl"

# ---- options ------------------------------------------------------------------------------------
TRAIN_NODES=2
GPUS=""
ENGINE=vllm
ENGINE_TP=1
MODEL=""
DATASET=""
RECIPE=configs/rloo.py:qwen3_8b
PORT=8100
COORD_PORT=""
HOST_SUFFIX=""
PLATFORM=gpu
TRAINER_RESTARTS=2
ENGINE_RESTARTS=""
ENGINE_TIMEOUT=1800
ENGINE_ARGS=""
ENGINE_VENV=""
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
while [[ $# -gt 0 && $1 == --* && $1 != --config* ]]; do
  [[ $1 == *=* ]] || die "option $1 needs a value: write it as $1=VALUE"
  name=${1%%=*}; value=${1#*=}; shift
  case $name in
    --train-nodes) TRAIN_NODES=$value ;;
    --gpus-per-node) GPUS=$value ;;
    --engine) ENGINE=$value ;;
    --engine-tp) ENGINE_TP=$value ;;
    --model) MODEL=$value ;;
    --dataset) DATASET=$value ;;
    --recipe) RECIPE=$value ;;
    --port) PORT=$value ;;
    --coordinator-port) COORD_PORT=$value ;;
    --host-suffix) HOST_SUFFIX=$value ;;
    --platform) PLATFORM=$value ;;
    --trainer-restarts) TRAINER_RESTARTS=$value ;;
    --engine-restarts) ENGINE_RESTARTS=$value ;;
    --engine-timeout) ENGINE_TIMEOUT=$value ;;
    --engine-args) ENGINE_ARGS=$value ;;
    --engine-venv) ENGINE_VENV=$value ;;
    *) die "unknown option $name (the options are listed at the top of launch/slurm_job.sh)" ;;
  esac
done
[[ $# -ge 1 && $1 != --* ]] || die "usage: sbatch --nodes=N $PROG [options] WORKDIR [--config.key=value ...]"
WORKDIR=$1; shift
OVERRIDES=("$@")

[[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_JOB_NODELIST:-} ]] || die "not inside a SLURM job: submit with sbatch --nodes=N $PROG ..."
if [[ -z $GPUS ]]; then
  GPUS=${SLURM_GPUS_PER_NODE:-4}
  GPUS=${GPUS##*:}  # SLURM_GPUS_PER_NODE may read "type:count", e.g. "h100:4"
fi
check_uint() { is_uint "$2" || die "$1=$2 is not a non-negative integer"; }
check_uint --train-nodes "$TRAIN_NODES"; check_uint --gpus-per-node "$GPUS"; check_uint --engine-tp "$ENGINE_TP"
check_uint --port "$PORT"; check_uint --trainer-restarts "$TRAINER_RESTARTS"; check_uint --engine-timeout "$ENGINE_TIMEOUT"
(( TRAIN_NODES >= 1 )) || die "--train-nodes=$TRAIN_NODES: at least one node must train"
(( GPUS >= 1 )) || die "--gpus-per-node=$GPUS: a node needs at least one GPU"
(( ENGINE_TP >= 1 && GPUS % ENGINE_TP == 0 )) || die "--engine-tp=$ENGINE_TP must divide --gpus-per-node=$GPUS"
case $ENGINE in vllm|jax) ;; *) die "--engine=$ENGINE: use vllm or jax" ;; esac
case $PLATFORM in gpu|cpu) ;; *) die "--platform=$PLATFORM: use gpu or cpu" ;; esac
if [[ -z $ENGINE_RESTARTS ]]; then ENGINE_RESTARTS=$([[ $ENGINE == jax ]] && echo 2 || echo 0); fi
check_uint --engine-restarts "$ENGINE_RESTARTS"
if [[ $ENGINE == vllm && $ENGINE_RESTARTS != 0 ]]; then
  die "--engine-restarts=$ENGINE_RESTARTS needs --engine=jax: a restarted vLLM engine serves the initial checkpoint, not the current policy (use 0; resubmitting the job resumes the run)"
fi
if [[ $ENGINE == vllm && -z $MODEL ]]; then die "--engine=vllm needs --model=DIR (an HF checkpoint of the initial policy)"; fi
if [[ -n $MODEL && ! -f $MODEL/config.json ]]; then die "--model=$MODEL is not an HF checkpoint directory (no config.json)"; fi
if [[ -n $DATASET && ! -e $DATASET ]]; then die "--dataset=$DATASET does not exist"; fi
if [[ -n $ENGINE_VENV && ! -f $ENGINE_VENV/bin/activate ]]; then die "--engine-venv=$ENGINE_VENV has no bin/activate"; fi
# Absolute paths: the roles run from the repository root on other nodes.
[[ -n $MODEL ]] && MODEL=$(cd "$MODEL" && pwd)
[[ -n $DATASET ]] && DATASET=$(cd "$(dirname "$DATASET")" && pwd)/$(basename "$DATASET")
[[ -n $ENGINE_VENV ]] && ENGINE_VENV=$(cd "$ENGINE_VENV" && pwd)
for o in "${OVERRIDES[@]}"; do
  case $o in
    --config.generator.sidecar_urls*|--config.generator.backend*|--config.generator.token_file*|--workdir*)
      die "$o is set by this script (engine URLs, --engine and WORKDIR); remove it" ;;
    --config.model.path*) die "$o: give the checkpoint as --model=DIR instead (the engines load it too)" ;;
    --config.data.dataset_path*) die "$o: give the prompt file as --dataset=FILE instead" ;;
    --config*) ;;
    *) die "unexpected argument $o after WORKDIR (only --config.key=value overrides go there)" ;;
  esac
done

mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
N=${#HOSTS[@]}
(( N > TRAIN_NODES )) || die "the job has $N node(s) and --train-nodes=$TRAIN_NODES: at least one node must run rollout engines (sbatch --nodes=$((TRAIN_NODES + 1)) or more)"
TRAIN_HOSTS=("${HOSTS[@]:0:TRAIN_NODES}")
ROLLOUT_HOSTS=("${HOSTS[@]:TRAIN_NODES}")
R=${#ROLLOUT_HOSTS[@]}
E=$((GPUS / ENGINE_TP))
COORD_PORT=${COORD_PORT:-$((SLURM_JOB_ID % 4096 + 61440))}
check_uint --coordinator-port "$COORD_PORT"
(( PORT + E - 1 <= 65535 && COORD_PORT + TRAINER_RESTARTS <= 65535 )) || die "ports out of range: --port=$PORT with $E engines a node, --coordinator-port=$COORD_PORT"

# ---- shared run state: directories, token, engine list -------------------------------------------
mkdir -p "$WORKDIR/sync" "$WORKDIR/logs" || die "cannot create $WORKDIR (it must be on a filesystem every node shares)"
WORKDIR=$(cd "$WORKDIR" && pwd)
TOKEN_FILE=$WORKDIR/.sidecar_token
if [[ ! -s $TOKEN_FILE ]]; then
  (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' > "$TOKEN_FILE.tmp.$$" && mv "$TOKEN_FILE.tmp.$$" "$TOKEN_FILE") \
    || die "cannot write the sidecar token $TOKEN_FILE"
fi
URLS=()
for h in "${ROLLOUT_HOSTS[@]}"; do
  for ((e = 0; e < E; e++)); do URLS+=("http://$h$HOST_SUFFIX:$((PORT + e))"); done
done
printf '%s\n' "${URLS[@]}" > "$WORKDIR/logs/engines.$SLURM_JOB_ID.txt"
URL_TUPLE="($(printf "'%s'," "${URLS[@]}"))"
COORD_HOST=${TRAIN_HOSTS[0]}$HOST_SUFFIX

note "job $SLURM_JOB_ID: $N nodes x $GPUS GPUs; trainer on ${TRAIN_HOSTS[*]} ($((TRAIN_NODES * GPUS)) devices, coordinator $COORD_HOST:$COORD_PORT); $((R * E)) $ENGINE engines (tensor parallel $ENGINE_TP) on ${ROLLOUT_HOSTS[*]}"
note "engines: ${URLS[*]} (list in $WORKDIR/logs/engines.$SLURM_JOB_ID.txt); token $TOKEN_FILE; weight sync $WORKDIR/sync"

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO" || die "cannot enter $REPO"

# ---- roles --------------------------------------------------------------------------------------
ROLLOUT_PID=""
TRAIN_PID=""
WAIT_PID=""

start_rollout() {
  local args=(--engine="$ENGINE" --gpus="$GPUS" --tp="$ENGINE_TP" --port="$PORT" --host-suffix="$HOST_SUFFIX"
              --model="${MODEL:-$REPO/jaxrl/assets/default_policy}" --sync-dir="$WORKDIR/sync" --token-file="$TOKEN_FILE"
              --restarts="$ENGINE_RESTARTS" --log-dir="$WORKDIR/logs" --platform="$PLATFORM" --venv="$ENGINE_VENV")
  local extra=()
  read -ra extra <<< "$ENGINE_ARGS"  # whitespace-separated words, no glob expansion
  srun --nodes="$R" --ntasks="$R" --ntasks-per-node=1 --relative="$TRAIN_NODES" --kill-on-bad-exit=1 \
    bash "$REPO/launch/rollout_node.sh" "${args[@]}" -- "${extra[@]}" &
  ROLLOUT_PID=$!
}

start_trainer() {  # $1 = attempt (a fresh coordinator port each time)
  local main_args=(--config="$RECIPE" --workdir="$WORKDIR" --config.generator.backend="$ENGINE"
                   --config.generator.sidecar_urls="$URL_TUPLE" --config.generator.token_file="$TOKEN_FILE")
  [[ -n $MODEL ]] && main_args+=(--config.model.path="$MODEL")
  [[ -n $DATASET ]] && main_args+=(--config.data.dataset_path="$DATASET")
  main_args+=("${OVERRIDES[@]}")
  local xla jax_platforms
  if [[ $PLATFORM == cpu ]]; then
    xla="--xla_force_host_platform_device_count=$GPUS"; jax_platforms=cpu
  else
    # XLA GPU flags valid for jaxlib 0.10/0.11; an unknown flag aborts XLA.
    xla="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"; jax_platforms=${JAX_PLATFORMS:-}
  fi
  JAXRL_COORDINATOR_ADDRESS="$COORD_HOST:$((COORD_PORT + $1))" JAXRL_NUM_PROCESSES=$TRAIN_NODES \
  XLA_FLAGS="$xla" JAX_PLATFORMS="$jax_platforms" \
  srun --nodes="$TRAIN_NODES" --ntasks="$TRAIN_NODES" --ntasks-per-node=1 --relative=0 --kill-on-bad-exit=1 \
    bash -c 'export JAXRL_PROCESS_ID=$SLURM_PROCID; exec python -m jaxrl.main "$@"' jaxrl-trainer "${main_args[@]}" &
  TRAIN_PID=$!
}

alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; }

stop_pid() {  # SIGTERM (srun forwards it to the step's tasks), SIGKILL after 60 s
  local pid=$1 i
  alive "$pid" || { [[ -n $pid ]] && wait "$pid" 2>/dev/null; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 120; i++)); do alive "$pid" || break; sleep 0.5; done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

stop_all() {
  stop_pid "$WAIT_PID"
  stop_pid "$TRAIN_PID"
  stop_pid "$ROLLOUT_PID"
}

finish() {  # $1 = exit code, $2 = message
  stop_all
  if [[ $1 == 0 ]]; then note "$2"; else note "$2"; note "job stopped; resubmit the same command to resume $WORKDIR from its last checkpoint"; fi
  exit "$1"
}

on_signal() { note "received a termination signal; stopping every role"; stop_all; exit 143; }
trap on_signal TERM INT HUP

# ---- run ----------------------------------------------------------------------------------------
start_rollout
python3 "$REPO/launch/wait_engines.py" --timeout="$ENGINE_TIMEOUT" --token-file="$TOKEN_FILE" "${URLS[@]}" &
WAIT_PID=$!
while alive "$WAIT_PID"; do
  if ! alive "$ROLLOUT_PID"; then
    wait "$ROLLOUT_PID"; rc=$?
    finish 1 "rollout role failed (srun exit code $rc) before all engines were up; engine logs are in $WORKDIR/logs/"
  fi
  sleep 1
done
wait "$WAIT_PID"; rc=$?; WAIT_PID=""
(( rc == 0 )) || finish 1 "the engines did not all answer /health within --engine-timeout=$ENGINE_TIMEOUT s; engine logs are in $WORKDIR/logs/"
note "all $((R * E)) engines are healthy"

attempt=0
start_trainer "$attempt"
while true; do
  sleep 1
  if ! alive "$TRAIN_PID"; then
    wait "$TRAIN_PID"; rc=$?; TRAIN_PID=""
    if (( rc == 0 )); then finish 0 "training finished; results in $WORKDIR"; fi
    if (( rc == 2 )); then finish 2 "the trainer rejected its arguments or config (exit code 2; see the error above); not restarting"; fi
    if (( attempt >= TRAINER_RESTARTS )); then
      finish 1 "trainer failed (exit code $rc) and has no restarts left (--trainer-restarts=$TRAINER_RESTARTS)"
    fi
    attempt=$((attempt + 1))
    note "trainer exited with code $rc; restarting it ($attempt of $TRAINER_RESTARTS), it resumes from its last checkpoint"
    start_trainer "$attempt"
  elif ! alive "$ROLLOUT_PID"; then
    wait "$ROLLOUT_PID"; rc=$?
    finish 1 "rollout role failed (srun exit code $rc): an engine is out of restarts or a rollout node died; engine logs are in $WORKDIR/logs/"
  fi
done
