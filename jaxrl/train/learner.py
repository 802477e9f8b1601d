"""The learner: the compiled functions of the policy update, and the two stages of an RL step
that run them on the mesh (docs/architecture.md §1):

`Learner.forward` cuts the step's packed batch (host arrays, identical on every process) into
mini-batches, places them on the mesh and computes each one's `old_logprobs` (and
`ref_logprobs`, and with a critic its values) before any update with the same partition as
training (SkyRL's `recompute_old_logprobs_per_minibatch`). The step's advantages are computed
between the two, over the whole step (`rl_step.RLStages.compute_advantages`). `Learner.optimize`
then runs `update_epochs_per_batch` passes over the mini-batches in a fixed order, one optimizer
step each (`step.train_step`), followed by the critic's (`critic_learner`) on the same mini-batches.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import config as config_lib
from jaxrl import parallel
from jaxrl.envs import DEFAULT_POLICY_DIR
from jaxrl.models import qwen3
from jaxrl.rl import losses, reductions
from jaxrl.rl.loss_config import LossConfig
from jaxrl.train import step as step_lib
from jaxrl.train.critic_learner import CriticLearner
from jaxrl.train.multihost import global_array
from jaxrl.train.prompts import derive_seed

# Packed-batch keys that stay on the host (inputs of the advantage stage), and the device arrays
# of a mini-batch that only the critic's update reads.
HOST_ONLY = ("token_rewards", "response_mask", "group_ids")
CRITIC_ONLY = ("old_values", "returns")
CRITIC_BATCH = ("tokens", "positions", "segment_ids", "loss_mask", "old_values", "returns")
CRITIC_METRIC_NAMES = {"critic_loss": "critic/critic_loss", "values_mean": "critic/values_mean",
                       "values_clipfrac": "critic/values_clipfrac", "grad_norm": "critic/grad_norm",
                       "lr": "critic/critic_lr", "update_skipped": "critic/update_skipped"}


def to_host(x) -> np.ndarray:
    """A global array in full on every process (a process_allgather across hosts)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

# Train-step metric -> run-log name (SkyRL names); other keys become policy/loss_metrics/<key>.
_POLICY_METRIC_NAMES = {"grad_norm": "policy/grad_norm", "lr": "policy/policy_lr", "loss": "policy/final_loss",
                        "policy_loss": "policy/policy_loss", "entropy": "policy/policy_entropy",
                        "update_skipped": "policy/update_skipped"}


def logprob_diff(old_logprobs, rollout_logprobs, loss_mask):
    """Trainer vs engine logprobs on the loss tokens of one mini-batch.

    Args: old_logprobs (log pi_old, the trainer's), rollout_logprobs (log mu, the engine's),
      loss_mask: `[N, T-1]`, float32 / float32 / int (target-aligned).
    Returns: (sum of |log pi_old - log mu|, number of loss tokens, max |.|), float32 scalars
      (max is 0 when there is no loss token).
    """
    m = loss_mask > 0
    d = jnp.where(m, jnp.abs(old_logprobs - rollout_logprobs), 0.0)
    return jnp.sum(d), jnp.sum(m.astype(jnp.float32)), jnp.max(d)


def row_logprob_diff(old_logprobs, rollout_logprobs, loss_mask):
    """Per row of one mini-batch: (sum of |log pi_old - log mu| over its loss tokens, its number of
    loss tokens), `[N]` float32 each (inputs as in `logprob_diff`)."""
    m = loss_mask > 0
    d = jnp.where(m, jnp.abs(old_logprobs - rollout_logprobs), 0.0)
    return jnp.sum(d, axis=1), jnp.sum(m.astype(jnp.float32), axis=1)


def combine_over_minibatches(step_metrics: list[dict]) -> dict[str, float]:
    """One value per train-step metric over the optimizer steps of an RL step: max / min for the
    keys `losses.metric_combine_rule` says combine so, else the mean (each mini-batch's value is
    already normalised by its mini-batch)."""
    out = {}
    for key in step_metrics[0]:
        vals = [float(m[key]) for m in step_metrics]
        rule = losses.metric_combine_rule(key)
        out[key] = max(vals) if rule == "max" else min(vals) if rule == "min" else float(np.mean(vals))
    return out


def policy_metrics(step_metrics: list[dict]) -> dict[str, float]:
    """The `policy/*` run-log metrics of an RL step's optimizer steps."""
    m = {_POLICY_METRIC_NAMES.get(k, f"policy/loss_metrics/{k}"): v
         for k, v in combine_over_minibatches(step_metrics).items()}
    if "policy/loss_metrics/clip_ratio" in m:
        m["policy/clip_ratio"] = m["policy/loss_metrics/clip_ratio"]
    return m


class Learner:
    """Compiled update functions of one run (rebuilt when the learning-rate scale changes).

    Args:
      c: the run config; model_cfg: the policy's `Qwen3Config`; mesh: the device mesh;
      param_sharding: where the compute-dtype params live; state_param_sharding: where the fp32
      master params live (pinned host memory under optimizer offload); loss_cfg: the objective.
    """

    def __init__(self, c, model_cfg, mesh, param_sharding, state_param_sharding, loss_cfg: LossConfig):
        self.c = c
        self.model_cfg = model_cfg
        self.mesh = mesh
        self.param_sharding = param_sharding
        self.state_param_sharding = state_param_sharding
        self.loss_cfg = loss_cfg
        n = c.generator.n_samples_per_prompt
        self.mini_rows = c.trainer.mini_batch_size * n
        self.num_minibatches = c.trainer.train_batch_size // c.trainer.mini_batch_size
        self.step_cfg = step_lib.StepConfig(loss=loss_cfg, temperature=c.trainer.algorithm.temperature,
                                            num_micro_batches=self.mini_rows // c.trainer.micro_batch_size,
                                            chunk_size=c.model.logprobs_chunk_size,
                                            save_probs=c.model.logprobs_save_probs,
                                            offload=c.trainer.optimizer.offload)
        # Optimizer-state placement: the fp32 master params (the training state) and/or the Adam
        # moments may live in pinned host memory (trainer.optimizer.offload).
        self.moments_on_host, _ = step_lib.offloaded(c.trainer.optimizer.offload)
        self.total_opt_steps = c.trainer.num_steps * self.num_minibatches * c.trainer.update_epochs_per_batch
        self.adv_cfg = config_lib.advantage_config(c)
        self.needs_reference = config_lib.needs_reference(c)  # a KL loss term or a KL-in-reward penalty
        # The value model, only for an estimator that needs one (gae); its state lives in it.
        self.critic = CriticLearner(c, mesh, c.model.path or DEFAULT_POLICY_DIR, self.total_opt_steps) \
            if config_lib.needs_critic(c) else None

    def build(self, lr_scale: float) -> None:
        """(Re)builds the optimizer with learning rate `lr * lr_scale` and the jitted functions."""
        o = self.c.trainer.optimizer
        self.tx, self.schedule = step_lib.make_optimizer(
            o.lr * lr_scale, self.total_opt_steps, warmup_steps=o.num_warmup_steps, schedule=o.scheduler,
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
        self.init_opt = jax.jit(self.tx.init, out_shardings=self.opt_sharding)
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
        self._loss_weights = jax.jit(lambda loss_mask, sequence_mask, old_logprobs, advantages, rng:
                                     reductions.compute_loss_weights(loss_mask, self.loss_cfg,
                                                                     sequence_mask=sequence_mask,
                                                                     old_logprobs=old_logprobs, advantages=advantages,
                                                                     rng=rng))
        self._logprob_diff = jax.jit(logprob_diff)
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())  # readable on every process
        self._row_logprob_diff = jax.jit(row_logprob_diff, out_shardings=(replicated, replicated))

    def publishable(self, params):
        """The params as the engines receive them: with an offloaded fp32 master, a device copy
        in the compute dtype (`weight_sync.publish` casts device params itself)."""
        if self.state_param_sharding is not self.param_sharding:  # fp32 master in host memory
            return self._device_publish(params)
        return params

    def abstract_state(self):
        """(params, opt_state) as sharded `ShapeDtypeStruct` trees (what a checkpoint restores)."""
        abstract_p = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  qwen3.abstract_params(self.model_cfg), self.state_param_sharding)
        abstract_o = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  jax.eval_shape(self.tx.init, qwen3.abstract_params(self.model_cfg)),
                                  self.opt_sharding)
        return abstract_p, abstract_o

    def forward(self, params, batch: dict[str, np.ndarray], ref_params=None, row_diffs: bool = False) -> "ForwardPass":
        """The forward passes of one RL step, before any update, with the partition of training.

        Cuts the packed batch (`batching.pack_trajectories`, host arrays identical on every
        process) into `num_minibatches` mini-batches of `mini_rows` rows, places each on the mesh
        (`multihost.global_array`) and computes its `old_logprobs` log π_old (and `ref_logprobs`
        log π_ref when a reference model is needed, `old_values` V_old with a critic), each
        `[mini_rows, T-1]` float32 (SkyRL's `recompute_old_logprobs_per_minibatch`).

        Args: params: the policy; ref_params: the reference policy (needed iff
          `needs_reference`); row_diffs: also compute the per-row trainer-vs-engine gap (the async
          modes' `async/logprob_diff_mean_staleness_<k>`).
        Returns: a `ForwardPass` (timings "fwd_logprobs", with a critic "fwd_values").
        """
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            minis, masks, diffs, rows = [], [], [], []
            for mb in range(self.num_minibatches):
                sl = slice(mb * self.mini_rows, (mb + 1) * self.mini_rows)
                dev = {k: global_array(v[sl], self.mesh) for k, v in batch.items() if k not in HOST_ONLY}
                masks.append(dev.pop("sequence_mask"))
                dev["old_logprobs"] = self._logprobs(params, dev["tokens"], dev["positions"], dev["segment_ids"])
                if self.needs_reference:
                    dev["ref_logprobs"] = self._logprobs(ref_params, dev["tokens"], dev["positions"],
                                                         dev["segment_ids"])
                diffs.append(self._logprob_diff(dev["old_logprobs"], dev["rollout_logprobs"], dev["loss_mask"]))
                if row_diffs:
                    rows.append(self._row_logprob_diff(dev["old_logprobs"], dev["rollout_logprobs"], dev["loss_mask"]))
                minis.append(dev)
            jax.block_until_ready(minis)
            timings["fwd_logprobs"] = time.perf_counter() - t0
            if self.critic is not None:
                t0 = time.perf_counter()
                for dev in minis:
                    dev["old_values"] = self.critic.values(dev["tokens"], dev["positions"], dev["segment_ids"])
                jax.block_until_ready(minis)
                timings["fwd_values"] = time.perf_counter() - t0
            diffs = jax.device_get(diffs)
            rows = (tuple(np.concatenate(x) for x in zip(*jax.device_get(rows))) if row_diffs else None)
        return ForwardPass(minibatches=minis, sequence_masks=masks, diffs=diffs, row_diffs=rows, timings=timings)

    def optimize(self, params, opt_state, fwd: "ForwardPass", advantages: np.ndarray, returns: np.ndarray, *,
                 step: int = 0) -> "OptimizeResult":
        """The optimizer steps of one RL step on the mini-batches of `fwd` (`forward`).

        Places each mini-batch's advantages (and returns, with a critic) on the mesh, computes
        its loss weights (`reductions.compute_loss_weights`: the reduction, and clip_cov /
        kl_cov's token selection, whose draw is seeded by (`seed`, `step`, mini-batch)), then runs
        `update_epochs_per_batch` passes over the mini-batches in a fixed order, one AdamW step
        each (`step.train_step`: the gradient summed over its micro-batches), then the critic's
        steps on the same mini-batches and weights.

        Args: params, opt_state: the training state (donated); advantages, returns: `[N, T-1]`
          float32 host arrays of the whole step (returns are read only with a critic); step: the
          RL step.
        Returns: an `OptimizeResult` (timings "policy_train", with a critic "critic_train").
        """
        timings: dict[str, float] = {}
        c = self.c
        with jax.set_mesh(self.mesh):
            t0 = time.perf_counter()
            weights = []
            for mb, (dev, sequence_mask) in enumerate(zip(fwd.minibatches, fwd.sequence_masks)):
                sl = slice(mb * self.mini_rows, (mb + 1) * self.mini_rows)
                dev["advantages"] = global_array(advantages[sl], self.mesh)
                if self.critic is not None:
                    dev["returns"] = global_array(returns[sl], self.mesh)
                rng = jax.random.key(derive_seed(c.seed, step, 5, mb))  # clip_cov's random draw
                weights.append(self._loss_weights(dev["loss_mask"], sequence_mask, dev["old_logprobs"],
                                                  dev["advantages"], rng))
            step_metrics: list[dict] = []
            for _ in range(c.trainer.update_epochs_per_batch):
                for dev, w in zip(fwd.minibatches, weights):
                    policy_batch = {k: v for k, v in dev.items() if k not in CRITIC_ONLY}
                    params, opt_state, met = self._train_step(params, opt_state, policy_batch, w)
                    step_metrics.append(met)
            step_metrics = jax.device_get(step_metrics)
            timings["policy_train"] = time.perf_counter() - t0
            critic_out: dict[str, float] = {}
            if self.critic is not None:
                t0 = time.perf_counter()
                critic_metrics = []
                for _ in range(c.trainer.update_epochs_per_batch):
                    for dev, w in zip(fwd.minibatches, weights):
                        critic_metrics.append(self.critic.update({k: dev[k] for k in CRITIC_BATCH}, w))
                critic_metrics = jax.device_get(critic_metrics)
                timings["critic_train"] = time.perf_counter() - t0
                for key, name in CRITIC_METRIC_NAMES.items():
                    if key in critic_metrics[0]:
                        critic_out[name] = float(np.mean([float(x[key]) for x in critic_metrics]))
        return OptimizeResult(params=params, opt_state=opt_state, step_metrics=step_metrics,
                              critic_metrics=critic_out, timings=timings)


@dataclasses.dataclass
class ForwardPass:
    """The step's mini-batches on the mesh with the forward passes done before any update
    (`Learner.forward`).

    Fields:
      minibatches: per mini-batch a dict of global arrays of `mini_rows` rows: the packed batch's
        device keys (`tokens, positions, segment_ids [R, T]`, `loss_mask, rollout_logprobs,
        advantages [R, T-1]`, `is_truncated [R]`) and `old_logprobs [R, T-1]` float32, with
        `ref_logprobs` and `old_values` when computed.
      sequence_masks: per mini-batch its `[R]` bool `sequence_mask` (False = excluded row).
      diffs: per mini-batch the `logprob_diff` triple (host floats).
      row_diffs: None, or the `row_logprob_diff` pair over the whole batch (`[N]` numpy each).
      timings: seconds of the forward passes ("fwd_logprobs", "fwd_values").
    """
    minibatches: list[dict]
    sequence_masks: list
    diffs: list
    row_diffs: Optional[tuple] = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    def gather(self, key: str) -> np.ndarray:
        """The `[N, ...]` host array of `key` over all mini-batches (in full on every process)."""
        return np.concatenate([to_host(dev[key]) for dev in self.minibatches])


@dataclasses.dataclass
class OptimizeResult:
    """What `Learner.optimize` returns: the training state after the step's optimizer steps,
    `step_metrics` (one dict of host floats per policy optimizer step), `critic_metrics` (the
    `critic/*` run-log means over the critic's steps; {} without a critic) and `timings`."""
    params: Any
    opt_state: Any
    step_metrics: list[dict]
    critic_metrics: dict[str, float]
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
