"""The per-token KL and entropy terms of the loss: :func:`kl_penalty` (KL(π_θ ‖ π_ref)
estimators k1 / k2 / k3 / abs), :func:`entropy_from_logits`, and the |x| with a zero subgradient
at 0 that the abs estimator and the kl_cov loss share (:func:`abs_with_zero_subgradient`).
Re-exported by :mod:`jaxrl.rl.losses`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.rl.loss_config import KL_ESTIMATORS, LOG_RATIO_CLAMP, _check_choice


@jax.custom_jvp
def abs_with_zero_subgradient(x):
    """|x| whose derivative is sign(x): 0 at x = 0 (torch's `abs` backward), not JAX's +1.

    The penalties |logπ − logπ_old| (kl_cov) and |logπ − logπ_ref| (the `abs` KL estimator) are
    evaluated exactly at their kink x = 0 in the common case (the first update of every step has
    π_θ = π_old; the first step has π_θ = π_ref). There the penalty is at its minimum, so the
    subgradient 0 is the one to take; JAX's `jnp.abs` differentiates to +1 at 0, which adds a
    spurious +coef·w to every selected token's gradient.

    Args: x float array. Returns: |x|, same shape and dtype.
    """
    return jnp.abs(x)


@abs_with_zero_subgradient.defjvp
def _abs_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.abs(x), jnp.sign(x) * t


def kl_penalty(logprobs, ref_logprobs, loss_mask, estimator: str = "k3"):
    """Per-token KL(π_θ ‖ π_ref) estimate (Schulman 2020, "Approximating KL divergence").

    With Δ = logπ − logπ_ref: k1 = Δ; abs = |Δ| (derivative sign(Δ), 0 at Δ = 0:
    `abs_with_zero_subgradient`); k2 = ½Δ²;
    k3 = clamp(exp(x) − x − 1, −10, 10) with x = clamp(−Δ, −20, 20) (SkyRL / verl low_var_kl).
    Differentiable in `logprobs`.

    Args: logprobs, ref_logprobs float [N, T]; loss_mask [N, T]; estimator name.
    Returns: float32 [N, T], 0 where masked (NaN/inf at masked positions do not leak).
    Raises: ValueError for an unknown estimator.
    """
    _check_choice("kl_estimator_type", estimator, KL_ESTIMATORS)
    mask = jnp.asarray(loss_mask).astype(bool)
    delta = jnp.where(mask, jnp.asarray(logprobs, jnp.float32), 0.0) - jnp.where(
        mask, jnp.asarray(ref_logprobs, jnp.float32), 0.0)
    if estimator == "k1":
        kl = delta
    elif estimator == "abs":
        kl = abs_with_zero_subgradient(delta)  # gradient 0 at Δ = 0 (π_θ = π_ref at step 0), as torch
    elif estimator == "k2":
        kl = 0.5 * delta * delta
    else:
        x = jnp.clip(-delta, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = jnp.clip(jnp.exp(x) - x - 1.0, -10.0, 10.0)
    return jnp.where(mask, kl, 0.0)


def entropy_from_logits(logits):
    """Entropy of softmax(logits) over the last axis: H = logsumexp(z) − Σ softmax(z)·z.

    Args: logits float [..., V], already divided by the sampling temperature; −inf entries
      (tokens masked out of the vocabulary) have probability 0 and contribute 0 (the limit
      p·log p → 0), not 0·(−inf) = NaN, in the value and in the gradient. Call it on chunks
      of the sequence (never materialise [N, T, V] float32 for a large vocabulary).
    Returns: float32 [...].
    """
    z = jnp.asarray(logits, jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jax.nn.softmax(z, axis=-1)
    z_finite = jnp.where(z == -jnp.inf, 0.0, z)  # p == 0 there; keeps 0·(−inf) out of value and grad
    return lse - jnp.sum(p * z_finite, axis=-1)
