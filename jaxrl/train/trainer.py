"""The RL loop (DESIGN.md §1): rollouts through the sidecar, advantages, PPO updates on the mesh,
weight publication, evaluation, checkpoints, run logs, best-by-EMA selection and collapse handling.

Batch semantics follow SkyRL: a step takes `train_batch_size` prompts, each sampled
`n_samples_per_prompt` times; `mini_batch_size` prompts (× n sequences) make one optimizer
step; each mini-batch is split into micro-batches of `micro_batch_size` sequences whose
gradients are accumulated; `update_epochs_per_batch` passes over the mini-batches in a fixed
order. `old_logprobs` are computed once per RL step, before any update, by the same code.

Determinism and resume: every random choice derives from (`seed`, step) — the prompts of step s,
the sampling seeds of its requests — and the checkpoint holds params, optimizer state, the
reward EMA and the data position, so a run killed at any point and restarted with the same
command continues from the last committed checkpoint and produces the same metrics.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import sys
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import config as config_lib
from jaxrl import gpu_memory, parallel
from jaxrl.buckets import round_up
from jaxrl.envs import (DEFAULT_POLICY_DIR, ChatTemplate, RolloutConfig, Trajectory, get_task_suite, load_tasks,
                        run_rollouts)
from jaxrl.models import hf_io, qwen3
from jaxrl.rl import advantages as adv_lib
from jaxrl.rl import losses
from jaxrl.rollout import weight_sync
from jaxrl.rollout.client import SidecarClient, SidecarError
from jaxrl.rollout.process import SidecarProcess
from jaxrl.rollout.types import SamplingParams
from jaxrl.train import step as step_lib
from jaxrl.train.checkpoint import (CheckpointStore, collect_unraisable, is_damage_error, replay_unraisable,
                                   silence_unraisable_about)
from jaxrl.train.metrics import RewardEMA, RunLogger, plot_rewards, write_report

# Keys that may differ between the rl_config.json of a run and the command that resumes it
# (sidecar URLs: a resubmitted cluster job gets other nodes for its engines; the optimizer offload
# only moves the state between device and host memory).
RESUMABLE_CHANGES = ("trainer.num_steps", "generator.sidecar_urls", "trainer.optimizer.offload")

# Fault injection for the kill tests: JAXRL_KILL_AT="<point>:<step>" makes the trainer SIGKILL
# itself at that point of that step (points: "generate" = after the first rollout turn was
# generated, "save" = while the checkpoint of the step is being written).
_KILL_ENV = "JAXRL_KILL_AT"


def _maybe_kill(point: str, step: int) -> None:
    spec = os.environ.get(_KILL_ENV, "")
    if spec and spec == f"{point}:{step}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _maybe_kill_sidecar(point: str, version: int, sidecars) -> None:
    """Fault injection: JAXRL_KILL_SIDECAR_AT="publish:<version>" SIGKILLs the first sidecar just
    before it is asked to load policy version <version> (a sidecar dying during weight sync)."""
    spec = os.environ.get("JAXRL_KILL_SIDECAR_AT", "")
    if sidecars and spec == f"{point}:{version}":
        sidecars[0].kill()


def _derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (stable across processes and Python versions)."""
    h = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def _sync(name: str) -> None:
    """Barrier across processes (no-op in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _broadcast_from_main(tree: Optional[dict]) -> dict:
    """Process 0's dict of numpy arrays, on every process (identity in a single-process run).

    Shapes are sent first (other processes do not know the bucketed length), then the arrays.
    """
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    meta = json.dumps({k: [list(v.shape), str(v.dtype)] for k, v in tree.items()}) if tree is not None else ""
    buf = np.zeros(1 << 16, np.uint8)
    if tree is not None:
        raw = np.frombuffer(meta.encode(), np.uint8)
        buf[:raw.size] = raw
    buf = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    spec = json.loads(bytes(buf).rstrip(b"\0").decode())
    template = tree if tree is not None else {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
    return {k: np.asarray(v) for k, v in multihost_utils.broadcast_one_to_all(template).items()}


def _global_array(x: np.ndarray, mesh) -> jax.Array:
    """A host array present in full on every process -> a global array with the batch sharding."""
    sharding = parallel.batch_sharding(mesh, x.ndim) if x.ndim else jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec())
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    if x.ndim and x.shape[0] % n:
        raise ValueError(f"batch of {x.shape[0]} rows does not split over data x fsdp = {n} devices")
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def _excluded_detail(t: Trajectory) -> str:
    """What went wrong in an excluded trajectory (its `info`), in one short line."""
    for key in ("error", "invalid_output", "reason"):
        if t.info.get(key):
            return " ".join(str(t.info[key]).split())[:200]
    return "no detail recorded"


def _logprob_diff(old_logprobs, rollout_logprobs, loss_mask):
    """Trainer vs engine logprobs on the loss tokens of one mini-batch.

    Args: old_logprobs (log pi_old, the trainer's), rollout_logprobs (log mu, the engine's),
      loss_mask: `[N, T-1]`, float32 / float32 / int (target-aligned).
    Returns: (sum of |log pi_old - log mu|, number of loss tokens, max |.|), float32 scalars
      (max is 0 when there is no loss token).
    """
    m = loss_mask > 0
    d = jnp.where(m, jnp.abs(old_logprobs - rollout_logprobs), 0.0)
    return jnp.sum(d), jnp.sum(m.astype(jnp.float32)), jnp.max(d)


class RunDirError(RuntimeError):
    """A file of the run directory cannot be used; the one-line message names it and the fix."""


class CheckpointError(RunDirError):
    """No usable checkpoint to resume from; the message names the files and the fix."""


def read_json_object(path: str, what: str, fix: str) -> dict:
    """The JSON object stored in `path`.

    Raises:
      RunDirError: unreadable, not UTF-8, not JSON, or JSON that is not an object; one line
        naming `path`, what it should be (`what`) and `fix`.
    """
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise RunDirError(f"{path}: cannot read the {what} ({e.strerror}). Fix: {fix}") from None
    except UnicodeDecodeError:
        raise RunDirError(f"{path}: the {what} is not text (binary or non-UTF-8 bytes). Fix: {fix}") from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: the {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}). "
                          f"Fix: {fix}") from None
    if not isinstance(obj, dict):
        raise RunDirError(f"{path}: the {what} must be a JSON object, found a JSON {type(obj).__name__}. Fix: {fix}")
    return obj


def sidecar_error_text(e: Exception) -> str:
    """A sidecar failure as a CLI user should read it: one line, without hints that name Python
    API (the client library suggests `SidecarProcess.restart()` to Python callers; the trainer
    has already restarted the sidecars it owns when the error reaches the user)."""
    text = " ".join(str(e).split())
    return re.sub(r"\s*\([^()]*\b[A-Z]\w*\.\w+\(\)[^()]*\)", "", text)  # "(... SidecarProcess.restart())"


def _one_line(e: BaseException, limit: int = 160) -> str:
    """`Type: message` of an exception on one line (long library messages cut at `limit`)."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _all_processes_ok(ok: bool, name: str) -> bool:
    """True iff `ok` holds on every process (so that all take the same branch)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


class _NoLogger:
    """Stands in for RunLogger on processes other than 0."""

    rows: list = []

    def log_step(self, *a, **k):
        pass

    def log_trials(self, *a, **k):
        pass

    def update_step(self, *a, **k):
        pass

    def close(self):
        pass


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def loss_config(c) -> losses.LossConfig:
    """The policy objective of a run config (`trainer.algorithm.*`, SkyRL names)."""
    a = c.trainer.algorithm
    opc = a.off_policy_correction
    return losses.LossConfig(
        policy_loss_type=a.policy_loss_type, loss_reduction=a.loss_reduction,
        max_seq_len=int(a.max_seq_len) or None, eps_clip_low=a.eps_clip_low, eps_clip_high=a.eps_clip_high,
        clip_ratio_c=a.clip_ratio_c, kl_loss_coef=a.kl_loss_coef, kl_estimator_type=a.kl_estimator_type,
        entropy_loss_coef=a.entropy_loss_coef, tis_ratio_type=opc.tis_ratio_type or None,
        token_tis_ratio_clip_high=opc.token_tis_ratio_clip_high,
        sequence_tis_ratio_clip_high=opc.sequence_tis_ratio_clip_high,
        off_policy_untruncated_only=opc.only_untruncated)


# ---------------------------------------------------------------------------------------------
# Batching: trajectories -> fixed-shape target-aligned arrays
# ---------------------------------------------------------------------------------------------

def bucket_length(n: int, buckets) -> int:
    """The smallest bucket >= n. Raises ValueError when n exceeds the largest bucket."""
    return round_up(n, buckets, "trajectory length (tokens)",
                    fix="add a larger trainer.seq_len_buckets entry or lower the generator limits")


# Trajectories that end with these stop reasons leave the loss: `env_error` (the environment
# failed, the reward says nothing about the policy) and `invalid_output` (the engine returned
# non-finite logprobs, out-of-vocabulary ids or a wrong length). They get loss mask 0, do not
# count as sequences in the loss reduction, are not in the advantage baselines, and are counted
# in `generate/num_excluded_<reason>`.
EXCLUDED_STOP_REASONS = ("env_error", "invalid_output")


def is_excluded(t: Trajectory) -> bool:
    """True when trajectory `t` must not be trained on (`EXCLUDED_STOP_REASONS`)."""
    return t.stop_reason in EXCLUDED_STOP_REASONS


def pack_trajectories(trajs: list[Trajectory], advantages: np.ndarray, buckets) -> dict[str, np.ndarray]:
    """Right-padded rows `[N, T]` (T bucketed) with target-aligned `[N, T-1]` arrays (DESIGN.md §3).

    Row i holds prompt_ids + response_ids; response token j sits at position P + j and is
    predicted at target index P + j - 1, which is where its loss_mask, rollout logprob and the
    trajectory's advantage go.

    An excluded trajectory (`is_excluded`) keeps only its prompt: its response (possibly holding
    out-of-vocabulary ids or non-finite logprobs) never reaches the model, its loss mask, rollout
    logprobs and advantages are 0, and `sequence_mask [N]` (bool) is False for it so it does not
    count as a sequence in the loss reduction.
    """
    n = len(trajs)
    excluded = [is_excluded(t) for t in trajs]
    lengths = [len(t.prompt_ids) + (0 if x else len(t.response_ids)) for t, x in zip(trajs, excluded)]
    T = bucket_length(max(lengths), buckets)
    tokens = np.zeros((n, T), np.int32)
    seg = np.zeros((n, T), np.int32)
    pos = np.zeros((n, T), np.int32)
    loss_mask = np.zeros((n, T - 1), np.int32)
    rollout_lp = np.zeros((n, T - 1), np.float32)
    adv = np.zeros((n, T - 1), np.float32)
    for i, (t, L) in enumerate(zip(trajs, lengths)):
        P = len(t.prompt_ids)
        seg[i, :L] = 1
        pos[i, :L] = np.arange(L)
        if excluded[i]:
            tokens[i, :L] = t.prompt_ids
            continue
        tokens[i, :L] = np.concatenate([t.prompt_ids, t.response_ids])
        R = len(t.response_ids)
        loss_mask[i, P - 1:P - 1 + R] = t.loss_mask
        rollout_lp[i, P - 1:P - 1 + R] = np.where(t.loss_mask > 0, t.rollout_logprobs, 0.0)
        adv[i, P - 1:P - 1 + R] = np.where(t.loss_mask > 0, advantages[i], 0.0)
    is_truncated = np.array([t.stop_reason != "stop" for t in trajs])
    return dict(tokens=tokens, positions=pos, segment_ids=seg, loss_mask=loss_mask,
                rollout_logprobs=rollout_lp, advantages=adv, is_truncated=is_truncated,
                sequence_mask=~np.array(excluded, bool))


def training_batch(trajs: list[Trajectory], adv_cfg: adv_lib.AdvantageConfig, buckets):
    """Rewards `[N]` float32, per-trajectory advantages `[N]` float32 and the packed batch of
    one step's trajectories. Excluded trajectories (`is_excluded`) are left out of the advantage
    baselines (`baseline_mask`) and of the loss (`pack_trajectories`)."""
    rewards = np.array([t.reward for t in trajs], np.float32)
    group_ids = np.array([t.group_id for t in trajs], np.int32)
    baseline_mask = np.array([not is_excluded(t) for t in trajs])
    advantages = np.asarray(adv_lib.compute_advantages(rewards, group_ids, baseline_mask, adv_cfg))
    return rewards, advantages, pack_trajectories(trajs, advantages, buckets)


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

class PromptSource:
    """Train prompts per step (deterministic in (seed, step)) and the fixed held-out eval prompts."""

    def __init__(self, c):
        self.c = c
        self._orders: dict[int, np.ndarray] = {}
        if c.data.task == "dataset":
            self.train_tasks = load_tasks(c.data.dataset_path)
            self.suite = None
        else:
            self.suite = get_task_suite(c.data.task)
        eval_name = c.data.eval_task or (c.data.task if self.suite else "")
        self.eval_suite = get_task_suite(eval_name) if eval_name else None

    def train_batch(self, step: int):
        c = self.c
        seed = _derive_seed(c.seed, step, 1)
        if self.suite is not None:
            return self.suite.dataset("train", num=c.trainer.train_batch_size, seed=seed)
        # Prompt k of the run (k = (step - 1) * B + i) is entry k % n of epoch k // n's permutation.
        n, B = len(self.train_tasks), c.trainer.train_batch_size
        out = []
        for k in range((step - 1) * B, step * B):
            epoch, within = divmod(k, n)
            if epoch not in self._orders:
                self._orders = {epoch: np.random.default_rng(_derive_seed(c.seed, epoch, 2)).permutation(n)}
            out.append(self.train_tasks[self._orders[epoch][within]])
        return out

    def eval_batch(self):
        """The held-out tasks ([] when there is no eval task or `data.num_eval_prompts` is 0)."""
        if self.eval_suite is None or self.c.data.num_eval_prompts == 0:
            return []
        return self.eval_suite.dataset("eval", num=self.c.data.num_eval_prompts, seed=_derive_seed(self.c.seed, 7))


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class TrainerState:
    """What a checkpoint stores besides params and optimizer state (JSON)."""

    step: int = 0
    policy_version: int = 0
    ema: dict = dataclasses.field(default_factory=dict)
    lr_scale: float = 1.0
    rollbacks: int = 0
    skipped_updates: int = 0
    events: list = dataclasses.field(default_factory=list)
    initial_eval: Optional[float] = None
    data_position: int = 0  # prompts consumed (= step * train_batch_size)
    best_ckpt_step: int = -1  # the saved step with the highest reward EMA (what best/ exports)
    best_ckpt_ema: float = -math.inf

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "TrainerState":
        """The state saved in a checkpoint; fields added since it was written take their defaults.

        Raises:
          CheckpointError: unknown fields (written by another jaxrl version), naming `where`.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise CheckpointError(f"{where}: unknown trainer-state fields {unknown} (written by another jaxrl "
                                  "version). Fix: resume with the jaxrl version that wrote it, or use a new --workdir")
        return cls(**d)


class Trainer:
    """Owns the model, optimizer, sidecars and logs of one run directory. Use `run(config, workdir)`."""

    def __init__(self, c, workdir: str, *, progress: bool = True):
        self.c = c
        self.workdir = os.path.abspath(workdir)
        self.progress = progress
        self.timings: dict[str, float] = {}
        # Multi-process runs (one process per host): process 0 drives the sidecars, rollouts,
        # evaluation and run logs; every process takes part in the sharded update, the weight
        # publication and the checkpoints. The run directory must be on a shared filesystem.
        self.is_main = jax.process_index() == 0
        config_lib.validate(c, num_devices=jax.device_count(), platform=jax.default_backend())
        if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
            raise config_lib.ConfigError("--workdir", f"{self.workdir} exists and is not a directory",
                                         "pass a directory (it is created if missing)")

        # Model and tokenizer.
        self.model_dir = c.model.path or DEFAULT_POLICY_DIR
        self.model_cfg = qwen3.Qwen3Config.from_pretrained(
            self.model_dir, dtype=c.model.compute_dtype, remat=c.model.remat, attention=c.model.attention_impl)
        need = config_lib.rollout_max_seq_len(c)
        if need > self.model_cfg.max_position_embeddings:
            raise config_lib.ConfigError(
                "generator.sampling_params.max_generate_length",
                f"a trajectory may reach {need} tokens (data.max_prompt_length + max_turns x max_generate_length), "
                f"more than the model's max_position_embeddings={self.model_cfg.max_position_embeddings}",
                "lower max_generate_length / max_turns / data.max_prompt_length, or cap trajectories with "
                "trainer.algorithm.max_seq_len")
        self.chat = ChatTemplate.from_pretrained(self.model_dir, enable_thinking=c.generator.enable_thinking)
        self.prompts = PromptSource(c)
        if c.data.task == "dataset":
            self._check_prompt_lengths(self.prompts.train_tasks)

        # Mesh and shardings.
        self.mesh = parallel.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
        axes = qwen3.param_logical_axes(self.model_cfg)
        try:
            self.param_sharding = parallel.param_shardings(axes, self.mesh,
                                                           shapes=qwen3.abstract_params(self.model_cfg))
        except parallel.ShardingError as e:
            raise config_lib.ConfigError("mesh", str(e), "set --config.mesh.data/fsdp/tensor to one of the "
                                         "mesh shapes listed above") from None

        # Objective.
        a = c.trainer.algorithm
        self.loss_cfg = loss_config(c)
        self.adv_cfg = adv_lib.AdvantageConfig(advantage_estimator=a.advantage_estimator,
                                               grpo_norm_by_std=a.grpo_norm_by_std,
                                               group_advantage_min_size=a.group_advantage_min_size)
        n = c.generator.n_samples_per_prompt
        self.mini_rows = c.trainer.mini_batch_size * n
        self.num_minibatches = c.trainer.train_batch_size // c.trainer.mini_batch_size
        self.step_cfg = step_lib.StepConfig(loss=self.loss_cfg, temperature=a.temperature,
                                            num_micro_batches=self.mini_rows // c.trainer.micro_batch_size,
                                            chunk_size=c.model.logprobs_chunk_size,
                                            save_probs=c.model.logprobs_save_probs,
                                            offload=c.trainer.optimizer.offload)
        # Optimizer-state placement: the fp32 master params (the training state) and/or the Adam
        # moments may live in pinned host memory (trainer.optimizer.offload).
        self.moments_on_host, master_on_host = step_lib.offloaded(c.trainer.optimizer.offload)
        self.state_param_sharding = parallel.with_memory_kind(self.param_sharding,
                                                              "pinned_host" if master_on_host else None)
        self.total_opt_steps = c.trainer.num_steps * self.num_minibatches * c.trainer.update_epochs_per_batch

        # Everything above only validates; from here on the run directory is written.
        os.makedirs(self.workdir, exist_ok=True)
        self._check_resume_config()
        _sync("config")
        self.ckpt = CheckpointStore(self.workdir, max_to_keep=c.trainer.max_ckpts_to_keep)
        self.sync_dir = os.path.join(self.workdir, "sync")
        self.state = TrainerState()
        self.ema = RewardEMA(span=c.trainer.ema_span)
        self.sidecars: list[SidecarProcess] = []
        self.client: Optional[SidecarClient] = None

    def _check_prompt_lengths(self, tasks) -> None:
        """Rejects a dataset whose rendered prompts exceed `data.max_prompt_length` (before any work)."""
        from jaxrl.envs import make_env

        limit = self.c.data.max_prompt_length
        for i, task in enumerate(tasks):
            env = make_env(task)
            n = len(self.chat.encode_prompt(env.reset(task), getattr(env, "tools", None)))
            if n > limit:
                raise config_lib.ConfigError(
                    "data.max_prompt_length", f"{self.c.data.dataset_path}: task {i} ({task.task_id or 'no id'}) "
                    f"renders to a {n}-token prompt, longer than max_prompt_length={limit}",
                    "raise --config.data.max_prompt_length or remove the long prompts from the dataset")

    # -- config / resume ----------------------------------------------------------------------
    def _check_resume_config(self):
        path = os.path.join(self.workdir, "rl_config.json")
        new = config_lib.to_json_dict(self.c)
        if os.path.exists(path):
            old = read_json_object(path, "resolved config of the run in this workdir",
                                   "restore the file, delete it to resume under the config of this command, "
                                   "or use a new --workdir")
            a, b = _flatten(old), _flatten(new)
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in RESUMABLE_CHANGES)
            if diff:
                raise config_lib.ConfigError(
                    diff[0], f"the workdir {self.workdir} holds a run with a different config "
                    f"(differs in: {', '.join(diff[:8])})", "resume with the same command, or use a new --workdir")
        if self.is_main:
            config_lib.write_json_atomic(path, new)

    # -- compiled functions -------------------------------------------------------------------
    def _build_optimizer(self):
        o = self.c.trainer.optimizer
        self.tx, self.schedule = step_lib.make_optimizer(
            o.lr * self.state.lr_scale, self.total_opt_steps, warmup_steps=o.num_warmup_steps, schedule=o.scheduler,
            weight_decay=o.weight_decay, b1=o.adam_betas[0], b2=o.adam_betas[1], eps=o.adam_eps,
            max_grad_norm=o.max_grad_norm)
        abstract_opt = jax.eval_shape(self.tx.init, qwen3.abstract_params(self.model_cfg))
        self.opt_sharding = parallel.opt_state_shardings(abstract_opt, qwen3.abstract_params(self.model_cfg),
                                                         self.param_sharding, self.mesh,
                                                         "pinned_host" if self.moments_on_host else None)
        mc, sc, tx, sched = self.model_cfg, self.step_cfg, self.tx, self.schedule
        self._train_step = jax.jit(
            lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=mc, step_cfg=sc, tx=tx, schedule=sched),
            out_shardings=(self.state_param_sharding, self.opt_sharding, None), donate_argnums=(0, 1))
        self._opt_init = jax.jit(self.tx.init, out_shardings=self.opt_sharding)
        # Offloaded master -> device, in the compute dtype the weights are published in.
        self._device_publish = jax.jit(
            lambda p: step_lib.cast_params(step_lib.to_memory(p, "device"), self.model_cfg.compute_dtype),
            out_shardings=self.param_sharding)

        micro = self.c.trainer.micro_batch_size
        temp, chunk = self.c.trainer.algorithm.temperature, self.c.model.logprobs_chunk_size

        def batch_logprobs(params, tokens, positions, segment_ids):
            k = tokens.shape[0] // micro
            split = lambda x: x.reshape(k, micro, *x.shape[1:])
            f = lambda xs: step_lib.sequence_logprobs(params, mc, *xs, temperature=temp, chunk_size=chunk)[0]
            lp = jax.lax.map(f, (split(tokens), split(positions), split(segment_ids)))
            return lp.reshape(tokens.shape[0], -1)

        self._logprobs = jax.jit(batch_logprobs)
        # Jitted so that it is one SPMD program over the global mini-batch in multi-process runs.
        self._loss_weights = jax.jit(lambda loss_mask, sequence_mask: losses.compute_loss_weights(
            loss_mask, self.loss_cfg, sequence_mask=sequence_mask))
        self._logprob_diff = jax.jit(_logprob_diff)

    # -- sidecars -----------------------------------------------------------------------------
    def _start_sidecars(self):
        c = self.c
        rows = min(512, c.trainer.train_batch_size * c.generator.n_samples_per_prompt)
        if c.generator.sidecar_urls:  # external sidecars (vLLM, or JAX ones started by launch/slurm_job.sh)
            self.client = SidecarClient(list(c.generator.sidecar_urls), token_file=self._token_file(),
                                        backend=c.generator.backend,
                                        max_prompts_per_request=max(1, rows // c.generator.n_samples_per_prompt))
            if c.generator.colocate_with_trainer:  # they must claim the configured share of the trainer's GPUs
                gpu_memory.check_external_sidecars(c, self.client.health())
            return
        max_seq = self._rollout_cfg().max_seq_len
        extra = ["--resume-latest", "--exit-with-parent", "--max-batch-rows", str(rows), "--max-seq-len", str(max_seq),
                 "--dtype", c.model.compute_dtype, "--log-level", "warning",
                 # request limits that admit every request this run sends (chunks of <= rows samples)
                 "--max-n", str(max(256, c.generator.n_samples_per_prompt)), "--max-prompt-tokens", str(max_seq),
                 "--max-total-tokens", str(max(1 << 25, rows * max_seq))]
        env = {"XLA_FLAGS": "", "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", ""), **gpu_memory.sidecar_env(c)}
        for i in range(c.generator.num_sidecars):
            sp = SidecarProcess(self.model_dir, sync_dir=self.sync_dir, token_file=self._token_file(), extra_args=extra,
                                env=env, log_path=os.path.join(self.workdir, f"sidecar_{i}.log"))
            self.sidecars.append(sp.start())
        for sp in self.sidecars:
            sp.wait_healthy()
        self.client = SidecarClient([sp.url for sp in self.sidecars], token_file=self._token_file(),
                                    max_prompts_per_request=max(1, rows // c.generator.n_samples_per_prompt))

    def _token_file(self) -> str:
        if self.c.generator.token_file:
            if not os.path.isfile(self.c.generator.token_file):
                raise config_lib.ConfigError("generator.token_file", f"{self.c.generator.token_file!r} does not exist",
                                             "point it at the token file the sidecars were started with")
            return self.c.generator.token_file
        path = os.path.join(self.workdir, ".sidecar_token")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16))
        return path

    def _restart_dead_sidecars(self) -> bool:
        """Restarts every trainer-owned sidecar process that has exited; True if any had.

        A restarted sidecar loads the newest committed policy version itself (--resume-latest).
        Raises:
          SidecarError: a sidecar did not come back (one line naming its log file).
        """
        dead = [sp for sp in self.sidecars if not sp.alive()]
        for sp in dead:
            print(f"jaxrl: sidecar {sp.url} died (exit code {sp.returncode}); restarting", file=sys.stderr)
            try:
                sp.restart()
            except (RuntimeError, TimeoutError) as e:
                raise SidecarError(sp.url, f"did not restart ({str(e).splitlines()[0]}); see its log "
                                           f"{sp.log_path}") from None
        return bool(dead)

    def _with_sidecar_restart(self, what: str, fn):
        """Runs `fn()`; if it fails because a sidecar died, restarts the dead sidecars and runs it
        once more. Both rollouts and weight loads go through here, so a sidecar killed at any
        point is restarted the same way.

        Raises:
          SidecarError: the retry failed too, or no sidecar had died (a refusal, an external
            sidecar that is down); the message says what failed, without library internals.
        """
        try:
            return fn()
        except SidecarError as e:
            if not self._restart_dead_sidecars():
                raise
            first = e
        try:
            return fn()
        except SidecarError as e:
            logs = ", ".join(sp.log_path for sp in self.sidecars)
            raise SidecarError(e.url, f"{what} failed again after restarting the sidecar that died ({first}); "
                                      f"sidecar logs: {logs}") from None

    def _publish(self, params, version: int):
        """Every process writes its shards of version `version` (in the engine's compute dtype,
        so trainer and engine hold the same weights); process 0 then has the sidecars load it,
        restarting a sidecar that died (also during the load) and loading again."""
        t0 = time.perf_counter()
        if self.state_param_sharding is not self.param_sharding:  # fp32 master in host memory
            params = self._device_publish(params)
        stats = weight_sync.publish(params, self.sync_dir, version, keep=self.c.trainer.weight_sync_keep,
                                    dtype=self.c.model.compute_dtype)
        if self.is_main:
            path = weight_sync.version_path(self.sync_dir, version)
            _maybe_kill_sidecar("publish", version, self.sidecars)
            self._with_sidecar_restart(f"loading policy version {version}",
                                       lambda: self.client.load_weights(version, path))
        self.state.policy_version = version
        self.timings["sync_weights"] = time.perf_counter() - t0
        self.last_sync_bytes = stats.bytes

    def _generate(self, tasks, sampling: SamplingParams, n: int):
        return self._with_sidecar_restart(
            "generation", lambda: run_rollouts(self.client, self.chat, tasks, sampling, self._rollout_cfg(n)))

    def _rollout_cfg(self, n: Optional[int] = None) -> RolloutConfig:
        g = self.c.generator
        max_seq = config_lib.rollout_max_seq_len(self.c)
        return RolloutConfig(n_samples_per_prompt=n or g.n_samples_per_prompt, max_turns=g.max_turns,
                             max_tokens_per_turn=g.sampling_params.max_generate_length, max_seq_len=max_seq,
                             execute_truncated_turns=g.execute_truncated_turns)

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Held-out success rate (reward >= `trainer.success_threshold`) and mean reward of the
        served policy version (process 0 only; other processes, and runs without eval prompts,
        get {})."""
        tasks = self.prompts.eval_batch()
        self._eval_version, self._eval_result = self.state.policy_version, {}  # same on every process
        if not tasks or not self.is_main:
            return {}
        t0 = time.perf_counter()
        es = self.c.generator.eval_sampling_params
        sp = self.c.generator.sampling_params
        sampling = SamplingParams(temperature=es.temperature, greedy=bool(es.greedy), top_p=sp.top_p,
                                  top_k=max(sp.top_k, 0), seed=_derive_seed(self.c.seed, 11),
                                  logprobs_mode=self.c.generator.logprobs_mode)
        trajs = self._generate(tasks, sampling, n=1)
        rewards = np.array([t.reward for t in trajs])
        self.timings["eval"] = time.perf_counter() - t0
        result = {"eval/success_rate": float(np.mean(rewards >= self.c.trainer.success_threshold)),
                  "eval/avg_reward": float(rewards.mean())}
        self._eval_result = result
        return result

    # -- one RL step --------------------------------------------------------------------------
    def _rollout_batch(self, step: int):
        """Process 0: rollouts, rewards, advantages and the packed batch of `step`."""
        c, n = self.c, self.c.generator.n_samples_per_prompt
        tasks = self.prompts.train_batch(step)
        sp = c.generator.sampling_params
        sampling = SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0),
                                  seed=_derive_seed(c.seed, step, 3), logprobs_mode=c.generator.logprobs_mode)
        t0 = time.perf_counter()
        trajs = self._generate(tasks, sampling, n=n)
        _maybe_kill("generate", step)
        self.timings["generate"] = time.perf_counter() - t0
        rewards, advantages, batch = training_batch(trajs, self.adv_cfg, c.trainer.seq_len_buckets)
        return trajs, rewards, advantages, batch

    def _rl_step(self, step: int, params, opt_state):
        c, n = self.c, self.c.generator.n_samples_per_prompt
        t_step = time.perf_counter()
        trajs = None
        if self.is_main:
            trajs, rewards, advantages, batch = self._rollout_batch(step)
            host = dict(batch, rewards=rewards, advantages_seq=advantages)
        else:
            host = None
        host = _broadcast_from_main(host)
        rewards, advantages = host.pop("rewards"), host.pop("advantages_seq")
        batch = host

        # Mini-batches are cut on the host; each becomes global arrays, and its old (and reference)
        # logprobs are computed before any update, with the same partition as training.
        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            minis, diffs = [], []
            for mb in range(self.num_minibatches):
                sl = slice(mb * self.mini_rows, (mb + 1) * self.mini_rows)
                dev = {k: _global_array(v[sl], self.mesh) for k, v in batch.items()}
                sequence_mask = dev.pop("sequence_mask")
                dev["old_logprobs"] = self._logprobs(params, dev["tokens"], dev["positions"], dev["segment_ids"])
                if losses.needs_reference_model(self.loss_cfg):
                    dev["ref_logprobs"] = self._logprobs(self.ref_params, dev["tokens"], dev["positions"],
                                                         dev["segment_ids"])
                diffs.append(self._logprob_diff(dev["old_logprobs"], dev["rollout_logprobs"], dev["loss_mask"]))
                minis.append((dev, self._loss_weights(dev["loss_mask"], sequence_mask)))
            jax.block_until_ready(minis)
            self.timings["fwd_logprobs"] = time.perf_counter() - t0
            diffs = jax.device_get(diffs)

            t0 = time.perf_counter()
            step_metrics: list[dict] = []
            for _ in range(c.trainer.update_epochs_per_batch):
                for dev, weights in minis:
                    params, opt_state, met = self._train_step(params, opt_state, dev, weights)
                    step_metrics.append(met)
            step_metrics = jax.device_get(step_metrics)
        self.timings["policy_train"] = time.perf_counter() - t0
        skipped = int(sum(m["update_skipped"] for m in step_metrics))
        self.state.skipped_updates += skipped

        self._publish(params, self.state.policy_version + 1)

        # Metrics (SkyRL names where the concept is the same).
        def agg(key):
            vals = [float(m[key]) for m in step_metrics]
            return max(vals) if key.endswith("_max") else min(vals) if key.endswith("_min") else float(np.mean(vals))

        m: dict[str, Any] = {}
        for key in step_metrics[0]:
            name = {"grad_norm": "policy/grad_norm", "lr": "policy/policy_lr", "loss": "policy/final_loss",
                    "policy_loss": "policy/policy_loss", "entropy": "policy/policy_entropy",
                    "update_skipped": "policy/update_skipped"}.get(key, f"policy/loss_metrics/{key}")
            m[name] = agg(key)
        if "policy/loss_metrics/clip_ratio" in m:
            m["policy/clip_ratio"] = m["policy/loss_metrics/clip_ratio"]
        m["policy/num_skipped_updates_total"] = self.state.skipped_updates
        grouped = rewards.reshape(-1, n)
        success = c.trainer.success_threshold
        m["reward/avg_raw_reward"] = float(rewards.mean())
        m[f"reward/avg_pass_at_{n}"] = float(np.mean(grouped.max(axis=1) >= success))
        m["reward/success_rate"] = float(np.mean(rewards >= success))
        # Trainer (pi_old) vs engine (mu) logprobs on the loss tokens: ~1e-6 when both hold the
        # same float32 weights; larger in bf16 (see docs/numerics.md).
        total, count = sum(float(d[0]) for d in diffs), sum(float(d[1]) for d in diffs)
        m["rollout/logprob_diff_mean"] = total / max(count, 1.0)
        m["rollout/logprob_diff_max"] = max(float(d[2]) for d in diffs)
        bound = config_lib.logprob_diff_warn_threshold(c)
        if self.is_main and bound > 0 and m["rollout/logprob_diff_max"] > bound:
            print(f"jaxrl: warning: step {step}: trainer and rollout engine logprobs differ by up to "
                  f"{m['rollout/logprob_diff_max']:.3g} (mean {m['rollout/logprob_diff_mean']:.3g}) on the loss "
                  f"tokens, above trainer.logprob_diff_warn_threshold={bound:g}; the engine does not sample from "
                  "the policy the trainer optimizes (see docs/numerics.md)", file=sys.stderr)
        if self.is_main:
            excluded = [t for t in trajs if is_excluded(t)]
            for reason in EXCLUDED_STOP_REASONS:
                m[f"generate/num_excluded_{reason}"] = sum(t.stop_reason == reason for t in excluded)
            if excluded:
                shown = "; ".join(f"{t.stop_reason} task {t.info.get('task_id') or '?'} group {t.group_id} sample "
                                  f"{t.info.get('sample_index', 0)}: {_excluded_detail(t)}" for t in excluded[:4])
                more = f"; ... {len(excluded) - 4} more in trial_stats.csv" if len(excluded) > 4 else ""
                print(f"jaxrl: step {step}: {len(excluded)} of {len(trajs)} trajectories excluded from the loss "
                      f"({shown}{more})", file=sys.stderr)
        m["loss/avg_raw_advantages"] = float(advantages.mean())
        m["loss/avg_raw_advantages_abs"] = float(np.abs(advantages).mean())
        ntok = batch["loss_mask"].sum(axis=1)
        m["generate/avg_num_tokens"] = float(ntok.mean())
        m["generate/max_num_tokens"] = float(ntok.max())
        m["generate/min_num_tokens"] = float(ntok.min())
        m["generate/truncated_ratio"] = float(np.mean(batch["is_truncated"]))
        m["generate/batch_padded_seq_len"] = float(batch["tokens"].shape[1])
        m["trainer/policy_version"] = self.state.policy_version
        ema, is_best = self.ema.update(step, float(rewards.mean()), drop=c.trainer.collapse.drop)
        m["reward/ema"] = ema
        self.timings["step"] = time.perf_counter() - t_step
        trials = [{"group_id": t.group_id, "sample_index": t.info.get("sample_index", 0), "reward": t.reward,
                   "advantage": float(a), "num_tokens": int(t.loss_mask.sum()), "num_turns": t.num_turns,
                   "stop_reason": t.stop_reason, "policy_version": t.policy_version,
                   "task_id": t.info.get("task_id", ""), "excluded": int(is_excluded(t)),
                   "error": _excluded_detail(t) if is_excluded(t) else "",
                   "prompt": self._decode(t.prompt_ids), "response": self._decode(t.response_ids)}
                  for t, a in zip(trajs or [], advantages)]
        return params, opt_state, m, trials, is_best

    def _decode(self, ids) -> str:
        """Text of token ids for the rollout logs; ids the tokenizer cannot decode (an engine's
        invalid output) are shown as numbers instead of failing the step."""
        try:
            return self.chat.tokenizer.decode([int(i) for i in ids])
        except Exception:  # out-of-vocabulary ids from a faulty engine
            return f"<undecodable token ids {[int(i) for i in ids][:64]}>"

    # -- checkpoints ----------------------------------------------------------------------------
    def _save(self, step: int, params, opt_state):
        """Checkpoints `step`, then prunes: the last `max_ckpts_to_keep` steps and the best stay.

        The best checkpoint is the saved step with the highest reward EMA; on a tie the earlier
        step stays best. It is recorded in the trainer state that is saved with the step, and it
        is the only step retention protects, so it is on disk whenever a checkpoint names it.
        """
        t0 = time.perf_counter()
        self.state.step = step
        self.state.data_position = step * self.c.trainer.train_batch_size
        self.state.ema = self.ema.state_dict()
        if self.ema.value is not None and self.ema.value > self.state.best_ckpt_ema:
            self.state.best_ckpt_step, self.state.best_ckpt_ema = step, float(self.ema.value)
        self.ckpt.save(step, params, opt_state, dataclasses.asdict(self.state))
        _maybe_kill("save", step)  # the async write is in flight here
        self.ckpt.wait()
        self.ckpt.prune(protect=[self.state.best_ckpt_step])
        self.timings["save_checkpoints"] = time.perf_counter() - t0

    def _restore(self, step: int):
        abstract_p = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  qwen3.abstract_params(self.model_cfg), self.state_param_sharding)
        abstract_o = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  jax.eval_shape(self.tx.init, qwen3.abstract_params(self.model_cfg)), self.opt_sharding)
        params, opt_state, ts = self.ckpt.restore(step, abstract_p, abstract_o)
        return params, opt_state, ts

    def _initial_params(self):
        """The starting policy (the HF checkpoint of `model.path`), sharded and placed like the
        training state."""
        with jax.set_mesh(self.mesh):
            return hf_io.load_hf_checkpoint(self.model_dir, self.model_cfg, shardings=self.state_param_sharding)[1]

    def _resume(self):
        """Restores the newest readable committed checkpoint.

        A checkpoint that cannot be read (a truncated or corrupt file) is reported in one line
        and moved to `checkpoints_damaged/`, and the previous committed one is used; when none is
        readable the run stops with one line naming them. If the best checkpoint the restored
        state names is gone (it was the damaged one), the best is re-chosen among the steps on
        disk by the reward EMA each recorded.

        Returns: (step, params, opt_state, TrainerState), or None when there is no checkpoint.
        Raises:
          CheckpointError: every committed checkpoint is damaged.
        """
        steps = self.ckpt.all_steps()
        damaged = []
        with collect_unraisable() as library_noise:  # Orbax's per-array tracebacks of a failed read
            for step in reversed(steps):
                try:
                    params, opt_state, ts = self._restore(step)
                    error = ""
                except Exception as e:  # noqa: BLE001 - classified by is_damage_error
                    if not is_damage_error(e):
                        raise
                    error = _one_line(e)
                if _all_processes_ok(not error, f"resume_{step}"):
                    break
                damaged.append((step, error or "unreadable on another process"))
        if damaged:  # their abandoned reads may still be finalized later: keep them quiet
            silence_unraisable_about(os.path.join(self.ckpt.directory, str(s)) + os.sep for s, _ in damaged)
        else:
            replay_unraisable(library_noise)  # nothing to do with a damaged checkpoint: show it
        if len(damaged) == len(steps):
            if not steps:
                return None
            raise CheckpointError(
                f"every checkpoint in {self.ckpt.directory} is damaged ({'; '.join(f'step {s}: {e}' for s, e in damaged)})"
                f". Fix: restore the files, or start over with a new --workdir")
        for bad, error in damaged:
            moved = self.ckpt.set_aside(bad)
            msg = (f"checkpoint {bad} in {self.ckpt.directory} is damaged ({error}); moved it to {moved} and "
                   f"resumed from step {step}")
            print(f"jaxrl: warning: {msg}", file=sys.stderr)
        state = TrainerState.from_dict(ts, where=f"{self.ckpt.directory}/{step}/trainer_state")
        state.events.extend(f"checkpoint {bad} was damaged ({error}); resumed from step {step}" for bad, error in damaged)
        on_disk = self.ckpt.all_steps()
        if state.best_ckpt_step not in on_disk:
            emas = {}  # the step just restored is always a candidate
            for s in (s for s in on_disk if s <= step):
                try:
                    emas[s] = float(self.ckpt.restore_trainer_state(s)["ema"]["value"])
                except Exception as e:  # noqa: BLE001 - a damaged older checkpoint is just not a candidate
                    if not is_damage_error(e):
                        raise
            best = max(emas, key=lambda s: (emas[s], -s))  # highest EMA; the earlier step on a tie
            print(f"jaxrl: warning: the best checkpoint {state.best_ckpt_step} is gone; the best is now step {best} "
                  f"(EMA {emas[best]:.4f}) among the steps on disk {on_disk}", file=sys.stderr)
            state.best_ckpt_step, state.best_ckpt_ema = best, float(emas[best])
        self.ckpt.prune(protect=[state.best_ckpt_step])  # leftovers of a run killed before its prune
        return step, params, opt_state, state

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        c = self.c
        t_run = time.perf_counter()
        self._build_optimizer()
        latest = self.ckpt.latest_step()
        summary_path = os.path.join(self.workdir, "summary.json")
        if latest is not None and latest >= c.trainer.num_steps and os.path.exists(summary_path):
            try:
                done = read_json_object(summary_path, "run summary", "")
            except RunDirError as e:  # written again below: the run resumes at its last step and finishes
                print(f"jaxrl: warning: {str(e).split('. Fix:')[0]}; finishing the run again to rewrite it",
                      file=sys.stderr)
            else:
                print(f"jaxrl: {self.workdir} is complete (step {latest} of {c.trainer.num_steps}); see report.md. "
                      "Raise --config.trainer.num_steps to continue training.", file=sys.stderr)
                self.ckpt.close()
                return done
        with jax.set_mesh(self.mesh):
            _, init_params = hf_io.load_hf_checkpoint(self.model_dir, self.model_cfg,
                                                      shardings=self.state_param_sharding)
            if losses.needs_reference_model(self.loss_cfg):
                # The starting policy in buffers of its own (loaded again, placed like the policy):
                # the train step donates the policy's buffers, so sharing them would delete it.
                self.ref_params = hf_io.load_hf_checkpoint(self.model_dir, self.model_cfg,
                                                           shardings=self.state_param_sharding)[1]
            resumed = self._resume() if latest is not None else None
            if resumed is None:
                params, opt_state = init_params, self._opt_init(init_params)
                start = 0
            else:
                start, params, opt_state, self.state = resumed
                self.ema = RewardEMA.from_state_dict(self.state.ema)
                if self.state.lr_scale != 1.0:
                    self._build_optimizer()
                print(f"jaxrl: resuming {self.workdir} from step {start}", file=sys.stderr)
        logger = (RunLogger(self.workdir, resume_step=start if resumed is not None else None) if self.is_main
                  else _NoLogger())
        if self.is_main:
            shutil.rmtree(self.sync_dir, ignore_errors=True)  # versions are republished from the checkpoint
            os.makedirs(self.sync_dir, exist_ok=True)
        _sync("sync_dir")
        stopped_by_collapse = False
        try:
            if self.is_main:
                self._start_sidecars()
            self._publish(params, self.state.policy_version)
            if start == 0 and c.trainer.eval_before_train:
                ev = self.evaluate()
                if ev:
                    self.state.initial_eval = ev["eval/success_rate"]
                    logger.log_step(0, {**ev, "timing/eval": self.timings["eval"]})
            bar = _progress(start, c.trainer.num_steps, enabled=self.progress and self.is_main)
            step = start
            for step in range(start + 1, c.trainer.num_steps + 1):
                params, opt_state, m, trials, is_best = self._rl_step(step, params, opt_state)
                if c.trainer.eval_interval and step % c.trainer.eval_interval == 0 or step == c.trainer.num_steps:
                    m.update(self.evaluate())
                    m["timing/eval"] = self.timings.get("eval", 0.0)
                for k in ("generate", "fwd_logprobs", "policy_train", "sync_weights", "step"):
                    m[f"timing/{k}"] = self.timings.get(k, 0.0)
                # Logs first, then the checkpoint: a run killed in between resumes from the previous
                # checkpoint and drops these rows, so logs never miss a step that a checkpoint covers.
                logger.log_step(step, m)
                logger.log_trials(step, trials)
                if ((is_best and c.trainer.save_on_new_best) or step % c.trainer.ckpt_interval == 0
                        or step == c.trainer.num_steps):
                    self._save(step, params, opt_state)
                    logger.update_step(step, {"timing/save_checkpoints": self.timings["save_checkpoints"]})
                bar.update(step, m["reward/avg_raw_reward"], m["reward/ema"], self.timings["step"])
                collapse = c.trainer.collapse
                if collapse.enabled and self.ema.steps_below >= collapse.patience:
                    event = (f"step {step}: reward EMA {self.ema.value:.3f} stayed more than {collapse.drop} below "
                             f"the best {self.ema.best_value:.3f} (step {self.ema.best_step}) for "
                             f"{self.ema.steps_below} steps")
                    if collapse.action == "rollback" and self.state.rollbacks < collapse.max_rollbacks:
                        params, opt_state = self._rollback(step, event)
                        self._save(step, params, opt_state)
                    else:
                        self.state.events.append(f"{event}; run stopped (collapse)")
                        self._save(step, params, opt_state)
                        stopped_by_collapse = True
                        break
            bar.close()
            summary = self._finish(logger, step, time.perf_counter() - t_run, stopped_by_collapse)
        finally:
            logger.close()
            for sp in self.sidecars:
                sp.stop()
            if self.client is not None:
                self.client.close()
            self.ckpt.close()
        return summary

    def _rollback(self, step: int, event: str):
        """Restores the best checkpoint (the initial policy with a fresh optimizer when no step has
        been saved yet) and lowers the learning rate by `collapse.lr_factor`."""
        best = self.state.best_ckpt_step
        self.state.rollbacks += 1
        self.state.lr_scale *= self.c.trainer.collapse.lr_factor
        target = f"step {best}" if best >= 1 else "the initial policy (no checkpoint saved yet)"
        self.state.events.append(f"{event}; rolled back to {target} with lr x{self.state.lr_scale:g}")
        self._build_optimizer()
        if best >= 1:
            params, opt_state, _ = self._restore(best)
        else:
            params = self._initial_params()
            with jax.set_mesh(self.mesh):
                opt_state = self._opt_init(params)
        self.ema.steps_below = 0
        self._publish(params, self.state.policy_version + 1)  # the next rollouts use the restored weights
        return params, opt_state

    def _finish(self, logger: RunLogger, last_step: int, wall_s: float, collapsed: bool) -> dict[str, Any]:
        c = self.c
        best = self.state.best_ckpt_step
        summary: dict[str, Any] = {"last_step": last_step, "best_step": best, "best_ema": self.state.best_ckpt_ema,
                                   "initial_eval": self.state.initial_eval, "wall_s": wall_s}
        if best >= 1:
            params, _, _ = self._restore(best)
            if best == last_step and getattr(self, "_eval_version", None) == self.state.policy_version:
                ev = self._eval_result  # the served weights are the best step's and were just evaluated
            else:
                self._publish(params, self.state.policy_version + 1)
                ev = self.evaluate()
            summary["best_eval"] = ev.get("eval/success_rate")
            if c.trainer.export_best:
                if jax.process_count() > 1:  # the exporter reads whole tensors on process 0
                    from jax.experimental import multihost_utils

                    params = multihost_utils.process_allgather(params, tiled=True)
                if self.is_main:
                    out = os.path.join(self.workdir, "best")
                    tmp = out + ".tmp"
                    shutil.rmtree(tmp, ignore_errors=True)
                    hf_io.save_hf_checkpoint(params, self.model_cfg, tmp, dtype="float32",
                                             tokenizer_dir=self.model_dir)
                    shutil.copy(os.path.join(self.workdir, "rl_config.json"), os.path.join(tmp, "rl_config.json"))
                    shutil.rmtree(out, ignore_errors=True)
                    os.replace(tmp, out)
        if not self.is_main:
            return summary
        plot_rewards(self.workdir, logger.rows, best)
        write_report(self.workdir, _report(c, summary, logger.rows, self.state, collapsed))
        config_lib.write_json_atomic(os.path.join(self.workdir, "summary.json"), summary)
        return summary


def _report(c, summary, rows, state: TrainerState, collapsed: bool) -> str:
    a = c.trainer.algorithm
    timing_keys = sorted({k for r in rows for k in r if k.startswith("timing/")})
    timing_lines = [f"| {k[7:]} | {np.mean([float(r[k]) for r in rows if k in r and r['step'] > 0] or [0]):.2f} |"
                    for k in timing_keys]
    last = rows[-1] if rows else {}
    lines = [
        f"# jaxrl run report: {c.name} ({c.scale})", "",
        "## Recipe", "",
        f"- advantage estimator `{a.advantage_estimator}`, policy loss `{a.policy_loss_type}` "
        f"(eps_clip_low {a.eps_clip_low}, eps_clip_high {a.eps_clip_high}), reduction `{a.loss_reduction}`",
        f"- kl_loss_coef {a.kl_loss_coef}, TIS `{a.off_policy_correction.tis_ratio_type or 'off'}`, "
        f"lr {c.trainer.optimizer.lr} (scale now {state.lr_scale:g}), grad clip {c.trainer.optimizer.max_grad_norm}",
        f"- {c.trainer.train_batch_size} prompts x {c.generator.n_samples_per_prompt} samples per step, "
        f"mini-batch {c.trainer.mini_batch_size} prompts, micro-batch {c.trainer.micro_batch_size} sequences",
        f"- policy `{c.model.path or 'embedded default'}`, task `{c.data.task}`", "",
        "## Result", "",
        f"- steps run: {summary['last_step']} of {c.trainer.num_steps}; wall time {summary['wall_s'] / 60:.1f} min",
        f"- best step by reward EMA (span {c.trainer.ema_span}): **{summary['best_step']}** "
        f"(EMA {summary['best_ema']:.3f})",
        _eval_line(c, summary),
        f"- final step: mean reward {float(last.get('reward/avg_raw_reward', float('nan'))):.3f}, "
        f"EMA {float(last.get('reward/ema', float('nan'))):.3f}",
        f"- skipped (non-finite) updates: {state.skipped_updates}", "",
        "## Events", "",
        *([f"- {e}" for e in state.events] or ["- none"]),
        *(["- the run stopped after a reward collapse"] if collapsed else []), "",
        "## Mean time per step (s)", "", "| phase | seconds |", "|---|---|", *timing_lines, "",
        "![reward](reward_plot.png)", "",
    ]
    return "\n".join(lines)


def _eval_line(c, summary) -> str:
    """The report's held-out line; says why there is no number when evaluation is off."""
    def fmt(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    if c.data.num_eval_prompts == 0:
        return "- held-out success: not evaluated (data.num_eval_prompts=0)"
    if not (c.data.eval_task or c.data.task != "dataset"):
        return "- held-out success: not evaluated (no held-out task: set data.eval_task to a built-in task)"
    return (f"- held-out success (reward >= {c.trainer.success_threshold:g}): start "
            f"{fmt(summary.get('initial_eval'))} -> best-EMA checkpoint {fmt(summary.get('best_eval'))}")


class _progress:
    """A tqdm bar over RL steps showing reward, EMA and step time (silent when disabled)."""

    def __init__(self, start: int, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="rl", unit="step", dynamic_ncols=True)
        self.last = start

    def update(self, step: int, reward: float, ema: float, seconds: float):
        if self.bar is not None:
            self.bar.update(step - self.last)
            self.bar.set_postfix(reward=f"{reward:.3f}", ema=f"{ema:.3f}", step_s=f"{seconds:.1f}")
        self.last = step

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run(c, workdir: str, progress: bool = True) -> dict[str, Any]:
    """Validates `c`, then trains in `workdir` (resuming from its latest checkpoint if any).

    Returns the run summary (best step, EMA, held-out success before and after, wall time).
    Raises:
      ConfigError: for an invalid config, before any work starts.
    """
    import logging

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return Trainer(c, workdir, progress=progress).run()
