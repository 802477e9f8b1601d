"""KL penalty in the reward and its controllers (Ziegler et al. 2019, "Fine-Tuning Language Models
from Human Preferences", arXiv 1909.08593, §2.2; SkyRL `use_kl_in_reward`, `kl_ctrl`).

The alternative to the KL loss term of jaxrl.rl.losses (`use_kl_loss`): the per-token estimate
of KL(π_old ‖ π_ref) is subtracted from the token rewards before the advantage estimator runs,
r_t ← r_t − β·kl_t, so the penalty reaches the policy only through the advantages (no gradient
flows through it). β is the controller's value: fixed, or adapted each RL step towards a target
KL. The controller's state is one float the trainer checkpoints; these are pure functions.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.rl.kl_entropy import kl_penalty

KL_CTRL_TYPES = ("fixed", "adaptive")
ADAPTIVE_ERROR_CLIP = 0.2  # Ziegler et al.: e_t clipped to [-0.2, 0.2]


def kl_penalized_rewards(token_rewards, old_logprobs, ref_logprobs, loss_mask, kl_coef, estimator: str = "k3",
                         sequence_mask=None):
    """r_t − max(0, β)·kl_t on the loss tokens, with kl_t = `kl_penalty(logπ_old, logπ_ref)`.

    Args:
      token_rewards: float [N, T] target-aligned.
      old_logprobs, ref_logprobs: float [N, T] (π_old: the trainer's logprobs of the rollout
        before any update, as SkyRL; π_ref: the reference model's).
      loss_mask: [N, T]; the penalty applies to the trained tokens only.
      kl_coef: β (float or scalar array); a negative β is treated as 0 (SkyRL).
      estimator: "k1", "k2", "k3" or "abs" (`kl_penalty`).
      sequence_mask: optional bool [N]; False rows (excluded trajectories) do not count in the metrics.
    Returns: (rewards float32 [N, T], metrics) with metrics avg_kl (mean over rows of each row's
      token-mean kl) and avg_kl_max (mean over rows of the row's max |kl|), float32 scalars, as
      SkyRL's loss/avg_kl and loss/avg_kl_max.
    Non-finite: masked entries never leak (kl_penalty sanitises them); a NaN logprob on a loss token
      reaches the reward (a model fault, not hidden).
    """
    mask = jnp.asarray(loss_mask).astype(bool)
    kl = jax.lax.stop_gradient(kl_penalty(old_logprobs, ref_logprobs, mask, estimator))
    beta = jnp.maximum(jnp.asarray(kl_coef, jnp.float32), 0.0)
    rewards = jnp.asarray(token_rewards, jnp.float32) - beta * kl
    rows = jnp.ones(mask.shape[:1], bool) if sequence_mask is None else jnp.asarray(sequence_mask).astype(bool)
    count = jnp.sum(mask, axis=1).astype(jnp.float32)
    row_mean = jnp.sum(kl, axis=1) / jnp.maximum(count, 1.0)
    row_max = jnp.max(jnp.where(mask, jnp.abs(kl), 0.0), axis=1)
    n = jnp.maximum(jnp.sum(rows.astype(jnp.float32)), 1.0)
    metrics = {"avg_kl": jnp.sum(jnp.where(rows, row_mean, 0.0)) / n,
               "avg_kl_max": jnp.sum(jnp.where(rows, row_max, 0.0)) / n}
    return rewards, metrics


def update_kl_coef(value: float, current_kl: float, n_steps: int, kl_ctrl_type: str, kl_target: float = 0.1,
                   horizon: int = 10000) -> float:
    """The controller's β for the next RL step.

    fixed: β unchanged. adaptive (Ziegler et al. 2019, §2.2): e = clip(KL/KL_target − 1, −0.2, 0.2),
    β ← β·(1 + e·n_steps/horizon), with KL the step's `avg_kl` and n_steps the number of
    trajectories the step trained on (SkyRL passes the batch size).

    Args: value β (>= 0); current_kl; n_steps >= 0; kl_ctrl_type "fixed" | "adaptive"; kl_target > 0;
      horizon > 0. Returns: float.
    Raises: ValueError for an unknown type, a non-positive target / horizon or a non-finite KL (adaptive).
    """
    if kl_ctrl_type not in KL_CTRL_TYPES:
        raise ValueError(f"kl_ctrl_type must be one of {KL_CTRL_TYPES}, got {kl_ctrl_type!r}.")
    if kl_ctrl_type == "fixed":
        return float(value)
    if not kl_target > 0 or not horizon > 0:
        raise ValueError(f"the adaptive KL controller needs kl_target > 0 and horizon > 0, got {kl_target}, {horizon}.")
    if not jnp.isfinite(current_kl):
        raise ValueError(f"the adaptive KL controller got a non-finite KL {current_kl}; the reference or policy "
                         "logprobs hold NaN/inf")
    error = min(max(float(current_kl) / kl_target - 1.0, -ADAPTIVE_ERROR_CLIP), ADAPTIVE_ERROR_CLIP)
    return float(value) * (1.0 + error * n_steps / horizon)


__all__ = ["KL_CTRL_TYPES", "kl_penalized_rewards", "update_kl_coef"]
