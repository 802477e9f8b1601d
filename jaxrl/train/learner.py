"""The learner: the compiled functions of the policy update and one RL step's update on the mesh.

`Learner.update` takes the packed batch of a step (host arrays, identical on every process),
cuts it into mini-batches on the host, computes each mini-batch's `old_logprobs` (and
`ref_logprobs`) before any update with the same partition as training (SkyRL's
`recompute_old_logprobs_per_minibatch`), then runs `update_epochs_per_batch` passes over the
mini-batches in a fixed order, one optimizer step each (`step.train_step`).
"""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import parallel
from jaxrl.config import loss_config  # noqa: F401  (re-exported: the trainer's objective)
from jaxrl.models import qwen3
from jaxrl.rl import losses
from jaxrl.train import step as step_lib
from jaxrl.train.multihost import global_array

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

    def __init__(self, c, model_cfg, mesh, param_sharding, state_param_sharding, loss_cfg: losses.LossConfig):
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
        self._loss_weights = jax.jit(lambda loss_mask, sequence_mask: losses.compute_loss_weights(
            loss_mask, self.loss_cfg, sequence_mask=sequence_mask))
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

    def update(self, params, opt_state, batch: dict[str, np.ndarray], ref_params=None, row_diffs: bool = False):
        """One RL step's policy update on the packed batch `batch` (`batching.pack_trajectories`).

        Returns: (params, opt_state, step_metrics, diffs, timings, rows): `step_metrics` one dict
        of host floats per optimizer step; `diffs` one `logprob_diff` triple per mini-batch;
        `timings` {"fwd_logprobs", "policy_train"} in seconds; `rows` None, or with `row_diffs`
        the `row_logprob_diff` pair over the whole batch (`[N]` numpy each).
        """
        timings: dict[str, Any] = {}
        # Mini-batches are cut on the host; each becomes global arrays, and its old (and reference)
        # logprobs are computed before any update, with the same partition as training.
        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            minis, diffs, rows = [], [], []
            for mb in range(self.num_minibatches):
                sl = slice(mb * self.mini_rows, (mb + 1) * self.mini_rows)
                dev = {k: global_array(v[sl], self.mesh) for k, v in batch.items()}
                sequence_mask = dev.pop("sequence_mask")
                dev["old_logprobs"] = self._logprobs(params, dev["tokens"], dev["positions"], dev["segment_ids"])
                if losses.needs_reference_model(self.loss_cfg):
                    dev["ref_logprobs"] = self._logprobs(ref_params, dev["tokens"], dev["positions"],
                                                         dev["segment_ids"])
                diffs.append(self._logprob_diff(dev["old_logprobs"], dev["rollout_logprobs"], dev["loss_mask"]))
                if row_diffs:
                    rows.append(self._row_logprob_diff(dev["old_logprobs"], dev["rollout_logprobs"], dev["loss_mask"]))
                minis.append((dev, self._loss_weights(dev["loss_mask"], sequence_mask)))
            jax.block_until_ready(minis)
            timings["fwd_logprobs"] = time.perf_counter() - t0
            diffs = jax.device_get(diffs)
            rows = (tuple(np.concatenate(x) for x in zip(*jax.device_get(rows))) if row_diffs else None)

            t0 = time.perf_counter()
            step_metrics: list[dict] = []
            for _ in range(self.c.trainer.update_epochs_per_batch):
                for dev, weights in minis:
                    params, opt_state, met = self._train_step(params, opt_state, dev, weights)
                    step_metrics.append(met)
            step_metrics = jax.device_get(step_metrics)
        timings["policy_train"] = time.perf_counter() - t0
        return params, opt_state, step_metrics, diffs, timings, rows
