"""The jitted pieces of one RL update: logprob forward, and the optimizer step with micro-batch
gradient accumulation.

The mini-batch loss is a weighted sum whose weights are fixed for the whole mini-batch
(`jaxrl.rl.reductions.compute_loss_weights`, docs/architecture.md §4), so the gradient accumulated
over K micro-batches inside one compiled `lax.scan` equals the gradient of the whole mini-batch, for
any K and any sharding of the rows. A non-finite gradient norm skips the update (params and
optimizer state unchanged, the schedule not advanced) and is reported as `update_skipped`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from jaxrl.models import attention as attention_lib
from jaxrl.models import qwen3
from jaxrl.rl import losses, reductions
from jaxrl.rl.loss_config import LossConfig

BATCH_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the compiled train step (hashable).

    Attributes:
      loss: the policy objective.
      temperature: logits / temperature in the trainer's logprobs (the sampling temperature).
      num_micro_batches: micro-batches per mini-batch (gradient accumulation steps).
      chunk_size: positions per chunk of the chunked log-softmax.
      save_probs: the loss's backward pass reads the probabilities saved by the forward pass
        instead of recomputing the logits (see
        :func:`jaxrl.models.logprob_head.logprobs_from_hidden`).
      offload: where the optimizer state lives between steps (:data:`OFFLOAD_MODES`):
        ``'none'`` (device memory), ``'moments'`` (Adam mu/nu in pinned host memory) or
        ``'moments_and_master'`` (also the fp32 master params). Offloaded trees must be passed
        in (and are returned in) ``pinned_host`` shardings, see :func:`jaxrl.parallel.with_memory_kind`.
    """

    loss: LossConfig
    temperature: float = 1.0
    num_micro_batches: int = 1
    chunk_size: int = 1024
    save_probs: bool = False
    offload: str = "none"

    def __post_init__(self):
        if self.offload not in OFFLOAD_MODES:
            raise ValueError(f"StepConfig.offload={self.offload!r}; expected one of {OFFLOAD_MODES}")


# Optimizer-state placements (trainer.optimizer.offload).
OFFLOAD_MODES = ("none", "moments", "moments_and_master")


def offloaded(offload: str) -> tuple[bool, bool]:
    """``(moments_on_host, master_on_host)`` for an offload mode (:data:`OFFLOAD_MODES`)."""
    if offload not in OFFLOAD_MODES:
        raise ValueError(f"unknown optimizer offload {offload!r}; use one of {OFFLOAD_MODES}")
    return offload != "none", offload == "moments_and_master"


def to_memory(tree, space: str, after=None):
    """Moves every array leaf of ``tree`` to ``space`` (``'device'`` or ``'host'``, i.e. pinned
    host memory) inside a jitted function, keeping its sharding.

    ``after``: optional pytree the transfer must wait for (an ``optimization_barrier`` ties the
    leaves to it), so that streaming an offloaded state to the device is not scheduled before
    the gradients exist (which would hold it in device memory through the forward/backward pass).
    """
    if after is not None:
        tree, _ = jax.lax.optimization_barrier((tree, after))
    target = jax.memory.Space.Device if space == "device" else jax.memory.Space.Host
    return jax.tree.map(lambda x: jax.device_put(x, target), tree)


def make_schedule(lr: float, total_steps: int, warmup_steps: int = 0, kind: str = "constant") -> optax.Schedule:
    """Learning rate per optimizer step: linear warm-up 0 → lr over `warmup_steps`, then constant,
    or cosine decay to 0 at `total_steps` (Loshchilov & Hutter 2017, SGDR eq. 5 without restarts).

    Raises:
      ValueError: for an unknown `kind`.
    """
    if kind not in ("constant", "cosine"):
        raise ValueError(f"unknown schedule {kind!r}; use 'constant' or 'cosine'")
    warmup_steps = max(int(warmup_steps), 0)
    after = (optax.constant_schedule(lr) if kind == "constant"
             else optax.cosine_decay_schedule(lr, max(total_steps - warmup_steps, 1)))
    if warmup_steps == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), after], [warmup_steps])


def make_optimizer(lr: float, total_steps: int, *, warmup_steps: int = 0, schedule: str = "constant",
                   weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   max_grad_norm: float = 1.0) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (Loshchilov & Hutter 2019) after global-norm gradient clipping; returns (tx, schedule)."""
    sched = make_schedule(lr, total_steps, warmup_steps, schedule)
    tx = optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
    )
    return tx, sched


def _constrain_rows(x, leading: int = 0):
    """Shards the row axis (after `leading` unsharded axes) over the batch mesh axes, if a mesh is set."""
    spec = P(*([None] * leading), BATCH_AXES, *([None] * (x.ndim - leading - 1)))
    try:
        return jax.lax.with_sharding_constraint(x, spec)
    except (ValueError, RuntimeError):  # no mesh in context (plain single-device use)
        return x


def sequence_logprobs(params, model_cfg: qwen3.Qwen3Config, tokens, positions, segment_ids, *,
                      temperature: float, chunk_size: int, save_probs: bool = False):
    """Target-aligned logprobs and entropies `[N, T-1]` float32 of `tokens [N, T]`.

    Entry t is log softmax(logits_t / temperature)[tokens[:, t+1]] (docs/architecture.md §3). `params` may be
    in pinned host memory (trainer.optimizer.offload='moments_and_master'): they are streamed to the
    device (a no-op for device arrays). `save_probs` only changes what a backward pass starts from.
    """
    params = to_memory(params, "device")
    return qwen3.logprobs(params, model_cfg, tokens, positions, segment_ids,
                          temperature=temperature, chunk_size=chunk_size, save_probs=save_probs)


def cast_params(params, dtype):
    """The param tree with every floating leaf cast to ``dtype`` (the model's compute dtype)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def _micro_loss(params, micro, weights, model_cfg, step_cfg: StepConfig):
    lp, ent = sequence_logprobs(params, model_cfg, micro["tokens"], micro["positions"], micro["segment_ids"],
                                temperature=step_cfg.temperature, chunk_size=step_cfg.chunk_size,
                                save_probs=step_cfg.save_probs)
    return losses.micro_batch_loss(
        lp, micro["old_logprobs"], micro["advantages"], micro["loss_mask"], weights, step_cfg.loss,
        rollout_logprobs=micro.get("rollout_logprobs"), ref_logprobs=micro.get("ref_logprobs"),
        entropy=ent, is_truncated=micro.get("is_truncated"))


def _metric_init(shapes):
    """Accumulator start values of the micro-batch metrics (losses.metric_identity)."""
    return {k: jnp.full(s.shape, losses.metric_identity(k), jnp.float32) for k, s in shapes.items()}


def accumulate_gradients(params, batch: dict, weights: reductions.LossWeights, model_cfg, step_cfg: StepConfig):
    """Sum of loss gradients over `step_cfg.num_micro_batches` micro-batches (a `lax.scan`).

    Args:
      params: param tree (float32).
      batch: the mini-batch, every array with leading row axis M: `tokens, positions, segment_ids
        [M, T] int32`; target-aligned `loss_mask, advantages, old_logprobs [M, T-1]` (and
        optionally `rollout_logprobs`, `ref_logprobs`); optional `is_truncated [M]` bool.
      weights: `compute_loss_weights` of the whole mini-batch (rows aligned with `batch`).
    Returns:
      (grads, metrics): grads like params (float32); metrics summed (max/min for `_max`/`_min`).
    Raises:
      ValueError: when M is not a multiple of num_micro_batches.
    """
    k = step_cfg.num_micro_batches
    m = batch["tokens"].shape[0]
    if m % k:
        raise ValueError(f"mini-batch of {m} rows does not split into {k} micro-batches")
    split = lambda x: _constrain_rows(x.reshape(k, m // k, *x.shape[1:]), leading=1)
    micro = jax.tree.map(split, batch)
    wmicro = jax.tree.map(split, weights)
    grad_fn = jax.grad(_micro_loss, has_aux=True)
    # The model casts every weight to the compute dtype before use, so the gradient w.r.t. the fp32
    # master equals the compute-dtype gradient cast to fp32. Casting once per step here (instead of
    # inside every layer of every micro-batch, and again in each rematerialized forward) gives
    # the same numbers with less work, and FSDP all-gathers the 16-bit copy.
    cparams = cast_params(params, model_cfg.compute_dtype)

    first = jax.tree.map(lambda x: x[0], (micro, wmicro))
    metric_shapes = jax.eval_shape(lambda mb, w: grad_fn(cparams, mb, w, model_cfg, step_cfg)[1], *first)

    def micro_grad(mb, w):
        if model_cfg.attention != "cudnn":
            return grad_fn(cparams, mb, w, model_cfg, step_cfg)
        # One layout check per micro-batch around the whole forward/backward pass, instead of the
        # per-layer lax.cond of attention 'cudnn': differentiated, that cond would make every
        # layer's cuDNN branch write (and, with save_*attention, keep) zero-filled copies of the
        # blocked branch's residuals. Both branches are exact; only one runs.
        _, fits = attention_lib.single_sequence_lengths(mb["segment_ids"])
        fast, exact = model_cfg.replace(attention="cudnn_no_fallback"), model_cfg.replace(attention="xla")
        return jax.lax.cond(fits, lambda: grad_fn(cparams, mb, w, fast, step_cfg),
                            lambda: grad_fn(cparams, mb, w, exact, step_cfg))

    def body(carry, xs):
        g_acc, met_acc = carry
        mb, w = xs
        g, met = micro_grad(mb, w)
        g_acc = jax.tree.map(lambda a, b: a + b.astype(a.dtype), g_acc, g)
        return (g_acc, losses.combine_metrics(met_acc, met)), None

    init = (jax.tree.map(jnp.zeros_like, params), _metric_init(metric_shapes))
    (grads, metrics), _ = jax.lax.scan(body, init, (micro, wmicro))
    return grads, metrics


def train_step(params, opt_state, batch: dict, weights: reductions.LossWeights, *, model_cfg, step_cfg: StepConfig,
               tx: optax.GradientTransformation, schedule: Callable[[Any], Any]):
    """One optimizer step on one mini-batch; returns (params, opt_state, metrics).

    Metrics: the loss metrics of `micro_batch_loss`, plus `grad_norm` (before clipping), `lr`
    (of this step), `update_skipped` (1.0 when the gradient norm was not finite and the update
    was not applied).

    With ``step_cfg.offload`` != 'none', the optimizer state (and, for 'moments_and_master', the
    fp32 params) arrive and leave in pinned host memory: the forward/backward pass reads only the
    compute-dtype copy of the params on the device, and the offloaded trees are streamed to the
    device for the update after the gradients are computed, then written back to the host.
    """
    moments_host, master_host = offloaded(step_cfg.offload)
    params_in = params
    if master_host:
        params = to_memory(params, "device")   # consumed by the compute-dtype cast in accumulate_gradients
    grads, metrics = accumulate_gradients(params, batch, weights, model_cfg, step_cfg)
    if master_host:
        params = to_memory(params_in, "device", after=grads)
    if moments_host:
        opt_state = to_memory(opt_state, "device", after=grads)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(grad_norm)
    # A non-finite gradient gives non-finite updates, which `keep` below discards (a select never
    # propagates the unselected operand). The gradients go to the optimizer as they are, so that
    # the clipping's global norm is the same computation as `grad_norm` (XLA computes it once:
    # one read of the gradients fewer than with a zeroed copy).
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    count = optax.tree_utils.tree_get_all_with_path(opt_state, "count")[0][1]  # optimizer steps taken
    metrics = dict(metrics, grad_norm=grad_norm, update_skipped=1.0 - finite.astype(jnp.float32),
                   lr=jnp.asarray(schedule(count), jnp.float32))
    new_params, new_opt_state = keep(new_params, params), keep(new_opt_state, opt_state)
    if master_host:
        new_params = to_memory(new_params, "host")
    if moments_host:
        new_opt_state = to_memory(new_opt_state, "host")
    return new_params, new_opt_state, metrics
