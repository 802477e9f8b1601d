"""The critic of a GAE run: its params and optimizer state, value forward and training step.

Created by the trainer only when the advantage estimator needs values (`config.needs_critic`).
The critic is `jaxrl.models.critic` (a Qwen3 trunk with a scalar value head) placed on the same
mesh with the same logical-axis rules as the policy; its trunk starts from
`trainer.critic.model.path` (default: the policy's starting checkpoint) and its head at 0.

Per RL step (docs/architecture.md §1, with a critic): `values` gives V_old for every mini-batch before any
update (the same partition as the policy's old logprobs); GAE turns rewards and V_old into
advantages and returns; then `update` takes one AdamW step per mini-batch on the clipped value
loss (`jaxrl.rl.value_loss`), with the gradient accumulated over the same micro-batches as the
policy's and the mini-batch's `LossWeights` (so it does not depend on micro-batching or
sharding). A non-finite gradient norm skips the critic's update (counted in
`critic/update_skipped`).

The critic's state lives in this object (`params`, `opt_state`); `Checkpoints` saves and restores
it with every checkpoint. Its optimizer state stays in device memory (trainer.optimizer.offload
applies to the policy only).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import optax

from jaxrl import parallel
from jaxrl.models import critic as critic_model
from jaxrl.models import hf_io, qwen3
from jaxrl.rl import losses, reductions, value
from jaxrl.train import step as step_lib


def critic_micro_loss(params, micro: dict, weights: reductions.LossWeights, model_cfg, value_clip: Optional[float]):
    """Clipped value loss of one micro-batch (`rl.value_loss`) and its metrics."""
    v = critic_model.values(params, model_cfg, micro["tokens"], micro["positions"], micro["segment_ids"])
    return value.value_loss(v, micro["old_values"], micro["returns"], micro["loss_mask"], weights, value_clip)


def critic_train_step(params, opt_state, batch: dict, weights: reductions.LossWeights, *, model_cfg,
                      value_clip: Optional[float], num_micro_batches: int, tx: optax.GradientTransformation,
                      schedule):
    """One optimizer step of the critic on one mini-batch.

    Args:
      params, opt_state: the critic's (float32 params).
      batch: `tokens, positions, segment_ids [M, T]` int32; target-aligned `loss_mask, old_values,
        returns [M, T-1]`.
      weights: `compute_loss_weights` of the whole mini-batch (the policy's).
      num_micro_batches: micro-batches the mini-batch is split into (gradients summed).
    Returns: (params, opt_state, metrics): metrics critic_loss, values_mean, values_clipfrac (with a
      clip), grad_norm (before clipping), lr, update_skipped (1.0 when the norm was not finite).
    Raises: ValueError when M is not a multiple of num_micro_batches.
    """
    k = num_micro_batches
    m = batch["tokens"].shape[0]
    if m % k:
        raise ValueError(f"mini-batch of {m} rows does not split into {k} micro-batches")
    split = lambda x: step_lib._constrain_rows(x.reshape(k, m // k, *x.shape[1:]), leading=1)  # noqa: E731
    micro = jax.tree.map(split, batch)
    wmicro = jax.tree.map(split, weights)
    grad_fn = jax.grad(critic_micro_loss, has_aux=True)
    cparams = step_lib.cast_params(params, model_cfg.compute_dtype)
    first = jax.tree.map(lambda x: x[0], (micro, wmicro))
    shapes = jax.eval_shape(lambda mb, w: grad_fn(cparams, mb, w, model_cfg, value_clip)[1], *first)

    def body(carry, xs):
        g_acc, met_acc = carry
        g, met = grad_fn(cparams, *xs, model_cfg, value_clip)
        return (jax.tree.map(lambda a, b: a + b.astype(a.dtype), g_acc, g), losses.combine_metrics(met_acc, met)), None

    init = (jax.tree.map(jnp.zeros_like, params), {k_: jnp.zeros(s.shape, jnp.float32) for k_, s in shapes.items()})
    (grads, metrics), _ = jax.lax.scan(body, init, (micro, wmicro))
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(grad_norm)
    safe = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, new_opt = tx.update(safe, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    count = optax.tree_utils.tree_get_all_with_path(opt_state, "count")[0][1]
    metrics = dict(metrics, grad_norm=grad_norm, lr=jnp.asarray(schedule(count), jnp.float32),
                   update_skipped=1.0 - finite.astype(jnp.float32))
    return keep(new_params, params), keep(new_opt, opt_state), metrics


class CriticLearner:
    """The critic of one run: state, shardings and compiled functions.

    Args:
      c: the run config; mesh: the device mesh; policy_dir: the policy's starting checkpoint (the
      critic's default trunk); total_opt_steps: optimizer steps of the run (the schedule length).
    Attributes: params, opt_state (None until `init` or `set_state`), model_cfg.
    """

    def __init__(self, c, mesh, policy_dir: str, total_opt_steps: int):
        self.c = c
        self.mesh = mesh
        self.model_dir = c.trainer.critic.model.path or policy_dir
        self.model_cfg = qwen3.Qwen3Config.from_pretrained(
            self.model_dir, dtype=c.model.compute_dtype, remat=c.model.remat, attention=c.model.attention_impl)
        shapes = critic_model.abstract_params(self.model_cfg)
        try:
            self.param_sharding = parallel.param_shardings(critic_model.param_logical_axes(self.model_cfg), mesh,
                                                           shapes=shapes)
        except parallel.ShardingError as e:
            from jaxrl.config import ConfigError

            raise ConfigError("mesh", f"the critic: {e}", "set --config.mesh.data/fsdp/tensor to one of the mesh "
                              "shapes listed above") from None
        o, co = c.trainer.optimizer, c.trainer.critic.optimizer
        self.tx, self.schedule = step_lib.make_optimizer(
            co.lr, total_opt_steps, warmup_steps=o.num_warmup_steps, schedule=o.scheduler,
            weight_decay=co.weight_decay, b1=o.adam_betas[0], b2=o.adam_betas[1], eps=o.adam_eps,
            max_grad_norm=co.max_grad_norm)
        self.opt_sharding = parallel.opt_state_shardings(jax.eval_shape(self.tx.init, shapes), shapes,
                                                         self.param_sharding, mesh, None)
        mini_rows = c.trainer.mini_batch_size * c.generator.n_samples_per_prompt
        num_micro = mini_rows // c.trainer.micro_batch_size
        value_clip = float(c.trainer.algorithm.value_clip) or None
        mc, tx, sched, micro = self.model_cfg, self.tx, self.schedule, c.trainer.micro_batch_size
        self._train_step = jax.jit(
            lambda p, s, b, w: critic_train_step(p, s, b, w, model_cfg=mc, value_clip=value_clip,
                                                 num_micro_batches=num_micro, tx=tx, schedule=sched),
            out_shardings=(self.param_sharding, self.opt_sharding, None), donate_argnums=(0, 1))
        self._init_opt = jax.jit(self.tx.init, out_shardings=self.opt_sharding)

        def batch_values(params, tokens, positions, segment_ids):
            k = tokens.shape[0] // micro
            split = lambda x: x.reshape(k, micro, *x.shape[1:])  # noqa: E731
            cp = step_lib.cast_params(params, mc.compute_dtype)
            v = jax.lax.map(lambda xs: critic_model.values(cp, mc, *xs), (split(tokens), split(positions),
                                                                           split(segment_ids)))
            return v.reshape(tokens.shape[0], -1)

        self._values = jax.jit(batch_values)
        self.params = None
        self.opt_state = None

    def init(self) -> None:
        """The starting critic: the trunk of `trainer.critic.model.path` (or the policy's
        checkpoint) and a zero value head, with a fresh optimizer state."""
        full_axes = qwen3.param_logical_axes(self.model_cfg)
        full_sharding = parallel.param_shardings(full_axes, self.mesh, shapes=qwen3.abstract_params(self.model_cfg))
        with jax.set_mesh(self.mesh):
            _, trunk = hf_io.load_hf_checkpoint(self.model_dir, self.model_cfg, shardings=full_sharding)
            self.params = critic_model.from_policy_params(trunk, self.model_cfg,
                                                          self.param_sharding[critic_model.VALUE_HEAD])
            self.opt_state = self._init_opt(self.params)

    def values(self, tokens, positions, segment_ids):
        """V_old [M, T-1] float32 (target-aligned) of a mini-batch's global arrays."""
        return self._values(self.params, tokens, positions, segment_ids)

    def update(self, batch: dict, weights: reductions.LossWeights) -> dict:
        """One optimizer step on one mini-batch (`critic_train_step`); returns its metrics (device)."""
        self.params, self.opt_state, metrics = self._train_step(self.params, self.opt_state, batch, weights)
        return metrics

    def abstract_state(self) -> dict:
        """{"params", "opt_state"} as sharded ShapeDtypeStruct trees (what a checkpoint restores)."""
        shapes = critic_model.abstract_params(self.model_cfg)
        struct = lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)  # noqa: E731
        return {"params": jax.tree.map(struct, shapes, self.param_sharding),
                "opt_state": jax.tree.map(struct, jax.eval_shape(self.tx.init, shapes), self.opt_sharding)}

    def state(self) -> dict:
        """{"params", "opt_state"}: what a checkpoint saves."""
        return {"params": self.params, "opt_state": self.opt_state}

    def set_state(self, state: dict) -> None:
        self.params, self.opt_state = state["params"], state["opt_state"]


__all__ = ["CriticLearner", "critic_micro_loss", "critic_train_step"]
