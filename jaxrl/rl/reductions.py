"""Mini-batch reductions: the per-token weights of ONE WHOLE mini-batch (:class:`LossWeights`,
:func:`compute_loss_weights`) that make the micro-batch loss a plain weighted sum (the contract in
the :mod:`jaxrl.rl.losses` docstring), the registered reductions (token_mean, sequence_mean,
seq_mean_token_sum_norm) and the mini-batch token selection of the covariance losses
(:func:`covariance_selection`). Re-exported by :mod:`jaxrl.rl.losses`.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxrl.rl.loss_config import LossConfig
from jaxrl.rl.registry import get_loss_reduction, register_loss_reduction


class LossWeights(NamedTuple):
    """Per-token / per-row normalisation of one mini-batch (row-aligned: split it with the batch).

    policy:        [N, T] weights of the configured `loss_reduction` (policy loss = Σ w·ℓ).
    token:         [N, T] loss_mask / max(Σ loss_mask, 1): global token mean (entropy, metrics).
    sequence_token:[N, T] loss_mask / (B · max(L_i, 1)): global sequence mean (KL term).
    sequence:      [N] sequence_mask / max(B, 1): mean over sequences (per-row metrics).
    selected:      [N, T] float 0/1 or None: the tokens the covariance losses (`clip_cov`,
                   `kl_cov`) act on, chosen once for the whole mini-batch (`covariance_selection`);
                   None for every other loss.
    B = Σ sequence_mask (rows with an all-zero loss_mask still count, as in SkyRL), L_i = Σ_t m.
    """

    policy: jax.Array
    token: jax.Array
    sequence_token: jax.Array
    sequence: jax.Array
    selected: Optional[jax.Array] = None


def _num_sequences(sequence_mask):
    return jnp.maximum(jnp.sum(sequence_mask), 1.0)


@register_loss_reduction("token_mean")
def token_mean_weights(loss_mask, sequence_mask, config):
    """w = m / max(Σ_{i,t} m, 1): Σ w·ℓ is the token mean over the whole mini-batch."""
    return loss_mask / jnp.maximum(jnp.sum(loss_mask), 1.0)


@register_loss_reduction("sequence_mean")
def sequence_mean_weights(loss_mask, sequence_mask, config):
    """w = m / (B · max(L_i, 1)): mean over sequences of each sequence's token mean."""
    lengths = jnp.maximum(jnp.sum(loss_mask, axis=1, keepdims=True), 1.0)
    return loss_mask * (sequence_mask[:, None] / (lengths * _num_sequences(sequence_mask)))


@register_loss_reduction("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm_weights(loss_mask, sequence_mask, config):
    """Dr. GRPO (Liu et al. 2025, eq. 3): w = m / (B · max_seq_len), max_seq_len a constant."""
    if config.max_seq_len is None:
        raise ValueError("seq_mean_token_sum_norm needs LossConfig.max_seq_len (a constant budget).")
    return loss_mask * (sequence_mask[:, None] / (_num_sequences(sequence_mask) * float(config.max_seq_len)))


# Accepted alias (SkyRL has no separate *_global variant: every reduction here is global).
register_loss_reduction("seq_mean_token_sum_norm_global")(seq_mean_token_sum_norm_weights)


def compute_loss_weights(loss_mask, config: LossConfig, sequence_mask=None, *, old_logprobs=None,
                         advantages=None, rng=None) -> LossWeights:
    """Normalisation of ONE WHOLE mini-batch; call it before splitting into micro-batches.

    Args:
      loss_mask: [N, T] (bool or 0/1), target-aligned, of the whole mini-batch; the mask BEFORE
        any off-policy masking (off-policy masks do not renormalise, as in SkyRL).
      config: LossConfig (`loss_reduction`, `max_seq_len`, the covariance-loss options).
      sequence_mask: optional [N] bool: False for padding rows added to reach a static shape
        (they do not count in the number of sequences B). None = every row is a sequence.
      old_logprobs, advantages: float [N, T] of the whole mini-batch; required by `clip_cov` and
        `kl_cov`, whose token selection is made here (`covariance_selection`).
      rng: a `jax.random` key; required by `clip_cov` (its random draw among candidates).
    Returns: LossWeights (float32).
    Raises: ValueError for bad shapes, an unknown reduction, a missing max_seq_len, or a covariance
      loss without old_logprobs / advantages / rng.
    """
    loss_mask = jnp.asarray(loss_mask)
    if loss_mask.ndim != 2:
        raise ValueError(f"loss_mask must be [N, T], got shape {loss_mask.shape}.")
    m = loss_mask.astype(bool).astype(jnp.float32)
    if sequence_mask is None:
        s = jnp.ones(m.shape[:1], jnp.float32)
    else:
        sequence_mask = jnp.asarray(sequence_mask)
        if sequence_mask.shape != m.shape[:1]:
            raise ValueError(f"sequence_mask must be [N] = {m.shape[:1]}, got {sequence_mask.shape}.")
        s = sequence_mask.astype(bool).astype(jnp.float32)
    m = m * s[:, None]
    reduction = get_loss_reduction(config.loss_reduction)
    policy = reduction(m, s, config)
    selected = None
    if config.policy_loss_type in COVARIANCE_LOSSES:
        if old_logprobs is None or advantages is None or (config.policy_loss_type == "clip_cov" and rng is None):
            raise ValueError(
                f"policy_loss_type={config.policy_loss_type!r} selects its tokens over the whole mini-batch: pass "
                "old_logprobs, advantages" + (" and rng" if config.policy_loss_type == "clip_cov" else "")
                + " to compute_loss_weights.")
        for name, x in (("old_logprobs", old_logprobs), ("advantages", advantages)):
            if jnp.shape(x) != m.shape:
                raise ValueError(f"{name} must have the shape of loss_mask {m.shape}, got {jnp.shape(x)}.")
        selected = covariance_selection(old_logprobs, advantages, m > 0, config, rng).astype(jnp.float32)
    return LossWeights(
        policy=policy.astype(jnp.float32),
        token=token_mean_weights(m, s, config),
        sequence_token=sequence_mean_weights(m, s, config),
        sequence=s / _num_sequences(s),
        selected=selected,
    )


# Losses whose per-token behaviour depends on a selection of tokens made over the whole mini-batch.
COVARIANCE_LOSSES = ("clip_cov", "kl_cov")


def _rank_descending(scores):
    """Rank (0 = largest) of every entry of `scores` [N, T] in the flattened mini-batch; ties are
    broken by position (row-major), so the ranking does not depend on how rows are sharded."""
    flat = scores.reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    return jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32)).reshape(scores.shape)


def _count_of(fraction, n):
    """max(⌊fraction · n⌋, 1) for a traced token count n (float32; the 1e-6 guards ⌊2 − ulp⌋ = 1)."""
    return jnp.maximum(jnp.floor(fraction * n * (1.0 + 1e-6)), 1.0)


def covariance_selection(old_logprobs, advantages, loss_mask, config: LossConfig, rng=None):
    """The tokens `clip_cov` / `kl_cov` act on (Cui et al. 2025, "The Entropy Mechanism of
    Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617, §4; SkyRL
    `compute_policy_loss_clip_cov` / `_kl_cov`).

    Per loss token, the centred covariance term cov_t = (A_t − Ā)·(logπ_old,t − mean logπ_old),
    means over the loss tokens of the whole mini-batch, n = their number.
      * clip_cov: candidates are the tokens with clip_cov_lb < cov < clip_cov_ub; k =
        max(⌊clip_cov_ratio · n⌋, 1) of them are drawn uniformly at random (all if fewer), with
        `rng`.
      * kl_cov: the k = max(⌊kl_cov_frac · n⌋, 1) tokens with the largest cov (ties by position).

    Deliberate difference from SkyRL: the selection is made ONCE per mini-batch from π_old and the
    mini-batch's advantages, before it is split, so it does not depend on micro-batching or
    sharding (SkyRL selects per micro-batch with the current logπ; at the first update of a step
    π_θ = π_old and the two agree, except that SkyRL's clip_cov also excludes tokens the PPO clip
    already cut, which at π_old are none). For clip_cov a token selected but later clipped by PPO
    has no gradient either way.

    Args: old_logprobs, advantages float [N, T]; loss_mask bool [N, T]; config; rng a key (clip_cov).
    Returns: bool [N, T].
    """
    m = jnp.asarray(loss_mask).astype(bool)
    old = jnp.where(m, jnp.asarray(old_logprobs, jnp.float32), 0.0)
    adv = jnp.where(m, jnp.asarray(advantages, jnp.float32), 0.0)
    n = jnp.sum(m.astype(jnp.float32))
    mean = lambda x: jnp.sum(x) / jnp.maximum(n, 1.0)  # noqa: E731
    cov = jnp.where(m, (adv - mean(adv)) * (old - mean(old)), 0.0)
    if config.policy_loss_type == "clip_cov":
        candidate = m & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
        score = jnp.where(candidate, jax.random.uniform(rng, m.shape), -1.0)
        k, eligible = _count_of(config.clip_cov_ratio, n), candidate
    else:
        score = jnp.where(m, cov, -jnp.inf)
        k, eligible = _count_of(config.kl_cov_frac, n), m
    return jax.lax.stop_gradient(eligible & (_rank_descending(score) < k))
