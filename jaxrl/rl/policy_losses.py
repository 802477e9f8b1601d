"""The registered per-token policy losses: regular (PPO-clip), dual_clip, gspo, cispo, sapo,
clip_cov and kl_cov, each ``(logprobs, old_logprobs, advantages, loss_mask, config,
rollout_logprobs) -> (per_token_loss, per_token_metrics)`` on inputs sanitised by
:func:`jaxrl.rl.losses.micro_batch_loss` (finite, 0 where masked; see
:func:`jaxrl.rl.registry.register_policy_loss`). Re-exported by :mod:`jaxrl.rl.losses`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.rl.kl_entropy import abs_with_zero_subgradient
from jaxrl.rl.loss_config import GSPO_LOG_WEIGHT_MAX, LOG_RATIO_CLAMP
from jaxrl.rl.registry import register_policy_loss


def _ratio(log_ratio, mask):
    """exp(clamp(Δ, ±20)) with Δ replaced by 0 where masked (ratio 1)."""
    return jnp.exp(jnp.clip(jnp.where(mask, log_ratio, 0.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _ppo_clip(ratio, advantages, config):
    """PPO-clip per-token loss (Schulman et al. 2017, eq. 7) with independent ε_low / ε_high.

    ℓ = max(−r·A, −clip(r, 1−ε_l, 1+ε_h)·A). The clipped branch is selected only where it is
    strictly larger (at a tie the unclipped branch carries the gradient).
    """
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - config.eps_clip_low, 1.0 + config.eps_clip_high)
    is_clipped = clipped > unclipped
    loss = jnp.where(is_clipped, clipped, unclipped)
    f = lambda b: b.astype(jnp.float32)
    metrics = {
        "clip_ratio": f(is_clipped),
        "clip_ratio_low": f(is_clipped & (ratio < 1.0 - config.eps_clip_low)),
        "clip_ratio_high": f(is_clipped & (ratio > 1.0 + config.eps_clip_high)),
        "ratio_mean": ratio,
        "ratio_max": ratio,
        "ratio_min": ratio,
    }
    return loss, metrics


@register_policy_loss("regular")
def regular_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None):
    """PPO-clip: r = π_θ/π_old, ℓ = max(−r·A, −clip(r, 1−eps_clip_low, 1+eps_clip_high)·A).

    Metrics: clip_ratio (fraction of loss tokens where the clipped branch is selected),
    clip_ratio_low (…with r < 1−ε_l, i.e. A < 0), clip_ratio_high (r > 1+ε_h, A > 0), ratio_*.
    """
    ratio = _ratio(logprobs - old_logprobs, loss_mask)
    return _ppo_clip(ratio, advantages, config)


@register_policy_loss("dual_clip")
def dual_clip_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None):
    """Dual-clip PPO (Ye et al. 2020, "Mastering complex control in MOBA games", eq. 5):
    the `regular` loss, then for A < 0: ℓ = min(ℓ, −c·A), c = clip_ratio_c.

    Metrics: those of `regular` (clip_ratio computed before the dual clip, as SkyRL) and
    dual_clip_ratio (fraction of loss tokens where the −c·A cap is active).
    """
    ratio = _ratio(logprobs - old_logprobs, loss_mask)
    loss, metrics = _ppo_clip(ratio, advantages, config)
    cap = -config.clip_ratio_c * advantages
    capped = (advantages < 0) & (cap < loss)
    metrics["dual_clip_ratio"] = capped.astype(jnp.float32)
    return jnp.where(capped, cap, loss), metrics


@register_policy_loss("gspo")
def gspo_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None):
    """GSPO-token (Zheng et al. 2025, arXiv 2507.18071, eq. 12-13): sequence-level ratio.

    log s_i = Σ_t m·(logπ − logπ_old) / max(L_i, 1); per-token log weight
    logπ_t − sg(logπ_t) + sg(log s_i), clamped to ≤ 10 (value s_i, gradient s_i·∇logπ_t), then
    the PPO-clip formula with eps_clip_low / eps_clip_high. SkyRL recommends sequence_mean.
    """
    delta = jnp.where(loss_mask, logprobs - old_logprobs, 0.0)
    length = jnp.maximum(jnp.sum(loss_mask, axis=1, keepdims=True), 1)
    log_seq_ratio = jax.lax.stop_gradient(jnp.sum(delta, axis=1, keepdims=True) / length)
    log_weight = logprobs - jax.lax.stop_gradient(logprobs) + log_seq_ratio
    ratio = jnp.exp(jnp.minimum(jnp.where(loss_mask, log_weight, 0.0), GSPO_LOG_WEIGHT_MAX))
    return _ppo_clip(ratio, advantages, config)


@register_policy_loss("cispo")
def cispo_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None):
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4): ℓ = −A · sg(clip(r, 1−ε_l^c, 1+ε_h^c)) · logπ.

    r = π_θ/b with b = π_old (`cispo_anchor="old"`) or μ ("rollout"). Metrics: clip_ratio
    (fraction of loss tokens with r outside the clamp), cispo/ratio_mean,
    cispo/ratio_clamped_mean, cispo/ratio_max, cispo/ratio_min (over loss tokens only).
    """
    if config.cispo_anchor == "rollout":
        if rollout_logprobs is None:
            raise ValueError("cispo with cispo_anchor='rollout' needs rollout_logprobs.")
        anchor = rollout_logprobs
    else:
        anchor = old_logprobs
    ratio = _ratio(logprobs - anchor, loss_mask)
    low, high = 1.0 - config.cispo_eps_clip_low, 1.0 + config.cispo_eps_clip_high
    clamped = jax.lax.stop_gradient(jnp.clip(ratio, low, high))
    loss = -advantages * clamped * logprobs
    metrics = {
        "clip_ratio": ((ratio < low) | (ratio > high)).astype(jnp.float32),
        "cispo/ratio_mean": ratio,
        "cispo/ratio_clamped_mean": clamped,
        "cispo/ratio_max": ratio,
        "cispo/ratio_min": ratio,
    }
    return loss, metrics


@register_policy_loss("sapo")
def sapo_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None):
    """SAPO, soft adaptive policy optimisation ("Soft Adaptive Policy Optimization", arXiv
    2511.20347; SkyRL `sapo`): a smooth gate instead of the hard PPO clip.

    r = exp(clamp(logπ − logπ_old, ±20)); τ = sapo_tau_pos if A > 0 else sapo_tau_neg;
    f(r) = σ(τ·(r − 1)) · 4/τ; ℓ = −f(r)·A. At r = 1, ∂ℓ/∂logπ = −A (f'(1)·1 = 1: the REINFORCE
    gradient); the gradient −A·r·f'(r) = −A·4r·σ(1 − σ) decays smoothly as r leaves 1. SkyRL
    recommends loss_reduction="sequence_mean" (the paper's).

    Metrics: sapo/gate_mean (mean of f(r)), ratio_mean / ratio_max / ratio_min. No clip_ratio (the
    gate never clips; SkyRL reports a constant 0).
    """
    ratio = _ratio(logprobs - old_logprobs, loss_mask)
    tau = jnp.where(advantages > 0, config.sapo_tau_pos, config.sapo_tau_neg)
    gate = jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    metrics = {"sapo/gate_mean": gate, "ratio_mean": ratio, "ratio_max": ratio, "ratio_min": ratio}
    return -gate * advantages, metrics


@register_policy_loss("clip_cov")
def clip_cov_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None, *, selected):
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617, §4.2; SkyRL `clip_cov`): the PPO-clip loss with
    the gradient of a few high-covariance tokens cut.

    ℓ = max(−r·A, −clip(r, 1−eps_clip_low, 1+eps_clip_high)·A) · (1 − s), s the token selection of
    `covariance_selection` (a random clip_cov_ratio of the tokens with clip_cov_lb < cov <
    clip_cov_ub), passed in by `micro_batch_loss` from `LossWeights.selected`.

    Metrics: clip_ratio = the fraction of loss tokens cut by the selection (SkyRL's meaning for
    this loss), ppo_clip_ratio (where the PPO clip is active), ratio_mean / ratio_max / ratio_min.
    Deliberate difference from SkyRL: r is exp(clamp(Δ, ±20)) like every other loss (SkyRL: no clamp).
    """
    ratio = _ratio(logprobs - old_logprobs, loss_mask)
    loss, ppo = _ppo_clip(ratio, advantages, config)
    keep = 1.0 - jax.lax.stop_gradient(selected)
    metrics = {"clip_ratio": 1.0 - keep, "ppo_clip_ratio": ppo["clip_ratio"],
               **{k: ppo[k] for k in ("ratio_mean", "ratio_max", "ratio_min")}}
    return loss * keep, metrics


@register_policy_loss("kl_cov")
def kl_cov_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs=None, *, selected):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, §4.2; SkyRL `kl_cov`): an unclipped
    policy-gradient loss with a KL penalty on the highest-covariance tokens.

    ℓ = −r·A + s · ppo_kl_coef · |logπ − logπ_old|, r = exp(clamp(logπ − logπ_old, ±20)), s the
    top-kl_cov_frac covariance selection of `covariance_selection` (`LossWeights.selected`).
    ∂|Δ|/∂logπ = sign(Δ), 0 at Δ = 0 (the first update of a step: the penalty is at its minimum;
    `abs_with_zero_subgradient`), so there the gradient is the REINFORCE one, −A·w.

    Metrics: kl_cov/selected_ratio (fraction of loss tokens penalised), kl_cov/abs_kl (mean
    |logπ − logπ_old| over all loss tokens), ratio_mean / ratio_max / ratio_min. No clip_ratio
    (nothing is clipped; SkyRL reports a constant 0).
    """
    delta = jnp.where(loss_mask, logprobs - old_logprobs, 0.0)
    ratio = _ratio(delta, loss_mask)
    s = jax.lax.stop_gradient(selected)
    abs_kl = abs_with_zero_subgradient(delta)  # gradient 0 at Δ = 0 (the first update), as torch
    metrics = {"kl_cov/selected_ratio": s, "kl_cov/abs_kl": jax.lax.stop_gradient(abs_kl),
               "ratio_mean": ratio, "ratio_max": ratio, "ratio_min": ratio}
    return -advantages * ratio + s * config.ppo_kl_coef * abs_kl, metrics
