"""The critic's objective: the clipped value loss of PPO, and the explained variance diagnostic.

Arrays are target-aligned [N, T] like the policy loss (jaxrl.rl.losses): `values` (V_θ, the
critic being trained, differentiable), `old_values` (V_old, the critic's predictions before the
step's updates, the ones GAE used), `returns` (the regression targets, GAE's A + V_old) and
`loss_mask`. The loss follows the mini-batch contract of jaxrl.rl.losses: a weighted SUM with
weights of the whole mini-batch (`LossWeights.sequence_token`), so it is the same for any split into
micro-batches or devices.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxrl.rl.reductions import LossWeights


def value_loss(values, old_values, returns, loss_mask, weights: LossWeights, value_clip: Optional[float] = 0.2):
    """Clipped value loss (PPO as implemented in OpenAI baselines ppo2; Engstrom et al. 2020,
    "Implementation Matters in Deep Policy Gradients", arXiv 2005.12729, §3; SkyRL
    `ppo_critic_loss`).

    ℓ_t = ½ · max((V_clip − R)², (V − R)²) (the unclipped branch at a tie) with V_clip = V_old + clamp(V − V_old, −c, c), c =
    `value_clip`; ℓ_t = ½ (V − R)² when value_clip is None. The mini-batch loss is Σ w·ℓ with
    w = `weights.sequence_token`: the mean over sequences of each sequence's token mean, as SkyRL
    (a masked mean per sequence, then the batch mean).

    Args:
      values: float [N, T], the critic's current predictions (differentiable).
      old_values, returns: float [N, T] (detached).
      loss_mask: [N, T] bool or 0/1.
      weights: this micro-batch's rows of `compute_loss_weights` of the whole mini-batch.
      value_clip: c > 0, or None for the unclipped loss.
    Returns: (loss float32 scalar, metrics): critic_loss (the loss), values_mean (token mean of
      V), values_clipfrac (fraction of loss tokens where the clipped branch is larger; only when
      value_clip is set), all micro-batch-summable.
    Non-finite values: entries off the loss mask never reach the loss or the gradient; NaN/inf on
      loss tokens is not hidden (a fault of the critic or of the returns).
    Raises: ValueError for shape mismatches or value_clip <= 0.
    """
    mask = jnp.asarray(loss_mask).astype(bool)
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns),
                    ("weights.sequence_token", weights.sequence_token), ("weights.token", weights.token)):
        if jnp.shape(x) != mask.shape:
            raise ValueError(f"{name} must have the shape of loss_mask {mask.shape}, got {jnp.shape(x)}.")
    if value_clip is not None and not value_clip > 0:
        raise ValueError(f"value_clip must be > 0 or None, got {value_clip}.")
    sg = jax.lax.stop_gradient
    clean = lambda x: jnp.where(mask, jnp.asarray(x, jnp.float32), 0.0)  # noqa: E731
    v, old, ret = clean(values), sg(clean(old_values)), sg(clean(returns))
    unclipped = (v - ret) ** 2
    metrics = {}
    if value_clip is not None:
        v_clip = old + jnp.clip(v - old, -value_clip, value_clip)
        clipped = (v_clip - ret) ** 2
        # At a tie (V = V_old, the first update of every step) the unclipped branch carries the
        # gradient (V − R), as in the policy's PPO clip; jnp.maximum would split it 1/2 : 1/2.
        is_clipped = clipped > unclipped
        per_token = jnp.where(is_clipped, clipped, unclipped)
        metrics["values_clipfrac"] = jnp.sum(weights.token * (mask & is_clipped).astype(jnp.float32))
    else:
        per_token = unclipped
    loss = 0.5 * jnp.sum(weights.sequence_token * jnp.where(mask, per_token, 0.0))
    metrics["critic_loss"] = loss
    metrics["values_mean"] = jnp.sum(weights.token * v)
    return loss, {k: sg(x) for k, x in metrics.items()}


def explained_variance(values, returns, mask):
    """1 − Var[R − V] / Var[R] over the masked tokens (the critic's fit; 1 = perfect, 0 = no better
    than a constant, < 0 worse). Population variances (ddof 0); NaN when Var[R] = 0 or no token is
    masked (the quantity is undefined there, and a logged NaN says so).

    Args: values, returns float [N, T]; mask [N, T] bool or 0/1. Returns: float32 scalar.
    """
    m = jnp.asarray(mask).astype(bool)
    n = jnp.sum(m.astype(jnp.float32))
    r = jnp.where(m, jnp.asarray(returns, jnp.float32), 0.0)
    d = jnp.where(m, r - jnp.asarray(values, jnp.float32), 0.0)

    def var(x):
        mean = jnp.sum(x) / jnp.maximum(n, 1.0)
        return jnp.sum(jnp.where(m, (x - mean) ** 2, 0.0)) / jnp.maximum(n, 1.0)

    var_r = var(r)
    return jnp.where((n > 0) & (var_r > 0), 1.0 - var(d) / jnp.where(var_r > 0, var_r, 1.0), jnp.nan)


__all__ = ["explained_variance", "value_loss"]
