"""Policy losses, mini-batch reductions, KL and entropy terms, off-policy correction.

All arrays are target-aligned [N, T] (docs/architecture.md §3: entry t scores the prediction of token t+1;
T here is the padded width minus one), one trajectory per row, float32 unless stated:
`logprobs` (log π_θ, differentiable), `old_logprobs` (log π_old, recomputed by the trainer),
`advantages`, `loss_mask` (bool or 0/1), optional `rollout_logprobs` (log μ from the rollout
engine), `ref_logprobs` (log π_ref) and `entropy` (per-token entropy of π_θ).

Layout: this module holds the micro-batch loss (`micro_batch_loss`, `minibatch_loss`), the rule
that combines its metrics (`metric_combine_rule`, `combine_metrics`) and `split_rows`; the parts
live next to it and are re-exported here:
  * `jaxrl.rl.loss_config`: `LossConfig`, its accepted values and clamps, `needs_reference_model`,
    `is_rollout_anchored`;
  * `jaxrl.rl.reductions`: `LossWeights`, the registered reductions, `compute_loss_weights`,
    `covariance_selection`;
  * `jaxrl.rl.policy_losses`: the registered per-token policy losses (regular ... kl_cov);
  * `jaxrl.rl.kl_entropy`: `kl_penalty`, `entropy_from_logits`, `abs_with_zero_subgradient`;
  * `jaxrl.rl.off_policy`: `off_policy_correction` (TIS and the off-policy masks).

How the trainer uses this module (the mini-batch contract, docs/architecture.md §4)
-------------------------------------------------------------------------
1. Once per mini-batch, BEFORE splitting it into micro-batches or sharding it:
       weights = compute_loss_weights(loss_mask_of_whole_minibatch, config, sequence_mask)
   `weights` is a `LossWeights` of row-aligned arrays ([N, T] and [N]); every normaliser
   (token count, sequence count, per-sequence length, max_seq_len) is folded into them.
2. Split `weights` by rows together with the batch (or shard both along the batch axis).
3. For each micro-batch: `loss, metrics = micro_batch_loss(..., weights=micro_weights, config)`.
   The loss is a plain weighted SUM over the micro-batch's tokens, so
       Σ_micro-batches loss == loss of the whole mini-batch, and so are the gradients.
   Accumulate gradients by SUMMING (never averaging) over micro-batches, and sum (psum) over
   data-parallel devices; a `jax.jit` of the whole mini-batch with the batch axis sharded does
   this automatically. Do not divide by the number of micro-batches or devices.
4. Combine the metrics of micro-batches / devices with `combine_metrics` (sum, except keys
   ending in `_max` / `_min`, which combine by max / min).

This is SkyRL's "loss reduction via advantage normalisation" made
explicit: instead of pre-scaling advantages, the per-token weights are passed alongside, which
also covers the KL and entropy terms and the metrics.

Numerics follow SkyRL: ratios are exp(clamp(Δ, −20, 20)) in float32; k3 is clamped (±20
inside, ±10 outside); the GSPO log-weight is clamped to ≤ 10.

Non-finite values (the rule, per input):
  * Masked entries never contribute: every input is passed through `jnp.where(loss_mask, x, 0)`
    before any exp/log/arithmetic, so NaN/inf at masked positions reach neither the loss, the
    metrics nor the gradient.
  * On loss tokens, NaN/inf in what the trainer computes (`logprobs`, `old_logprobs`,
    `ref_logprobs`, `entropy`, `advantages`) is NOT hidden: it reaches the loss, so the step's
    non-finite check sees it (a NaN there is a fault of the model or the trainer).
  * `rollout_logprobs` come from the rollout engine (an external input). A row with a NaN/inf
    rollout logprob on a loss token is invalid engine output (the rollout loop already ends such
    trajectories as `invalid_output` and the trainer drops them; this is the library's own guard):
    it is dropped from the policy-gradient term (whatever the loss and off-policy correction), its
    tokens are skipped by the ratio metrics (`is_ratio_max/min` ignore them, `is_ratio_mean` counts
    them as ρ = 1), and `invalid_rollout_seq_ratio` reports the fraction of such rows. The KL and
    entropy terms do not use μ and keep the row.
  * Audit of exp / log / 0·inf on unmasked input: every exp takes a clamped argument (ratios, k3,
    TIS, product mask; the geometric mean is a mean of clamped terms); there is no log; a product
    with a possibly infinite factor (`p · z` in `entropy_from_logits` with −inf logits) is taken only
    where the factor is finite.

Metrics (one rule for every family): a metric is reported iff the option or input that
produces it is active; an option that is off reports nothing, never a placeholder 0.
A metric never counts what a mask removed: the policy loss's fractions (clip_ratio, ...) and
max/min count only the tokens in the loss term (not those of rows dropped as invalid or by an
off-policy mask, nor tokens the token mask dropped); its means (`*_mean`, `kl_cov/abs_kl`) count
such a loss token at its value at π_θ = π_old (ratio 1), like `is_ratio_mean`; the off-policy
metrics follow the same rule (`off_policy_correction`). Fractions are of the mini-batch's loss
tokens (or rows), so they add up over micro-batches.
  * the policy loss's own metrics: those of `policy_loss_type` only (e.g. clip_ratio exists for
    the clipping losses, not for sapo / kl_cov, where SkyRL logs a constant 0);
  * off-policy correction: is_ratio_mean/max/min iff any correction is enabled
    (`uses_off_policy_correction`), plus the metrics of each enabled part (outlier_seq_*,
    token_mask_ratio, tis_*_clip_high_ratio, {geo,product}_sequence_mask_*);
  * invalid_rollout_seq_ratio iff rollout_logprobs are given (the invalid-row guard is then on);
  * policy_kl iff ref_logprobs are given; kl_loss iff the KL loss term is on;
  * entropy iff the per-token entropy is given; policy_loss, loss and approx_kl always.

Deliberate differences from SkyRL:
  * KL term: same estimator, but normalised as a global SEQUENCE mean over the mini-batch (SkyRL:
    a per-micro-batch sequence mean weighted by micro-batch size, which equals it when
    micro-batches are equal-sized). Entropy: a global TOKEN mean over the mini-batch (SkyRL: a
    per-micro-batch token mean weighted by micro-batch size, which depends on micro-batching).
  * Ratio metrics (`ratio_*`, `is_ratio_*`, `cispo/ratio_*`) are means / max / min over loss
    tokens only; SkyRL's `is_ratio_max/min/std` count masked positions as 0.
  * No `use_kl_loss` / `use_entropy_loss` flags: a term is on iff its coefficient is non-zero,
    and the reference model is needed iff `kl_loss_coef != 0` (`needs_reference_model`).
  * `only_untruncated` (new): apply the off-policy correction (TIS factor and
    masks) only to rows whose `is_truncated` is False.
  * Rows are trajectories: sequence-level quantities (sequence_mean, GSPO, sequence TIS,
    sequence masks) are per ROW, so rows must not pack several trajectories when they are used.
"""
from __future__ import annotations

from typing import Dict

import jax
import jax.numpy as jnp

# Re-exported: the options, the reductions, the per-token losses, the KL and entropy terms and the
# off-policy correction live in their own modules (module docstring, "Layout").
from jaxrl.rl.loss_config import (  # noqa: F401
    CISPO_ANCHORS,
    GSPO_LOG_WEIGHT_MAX,
    KL_ESTIMATORS,
    LOG_RATIO_CLAMP,
    SEQUENCE_MASK_METRICS,
    TIS_RATIO_TYPES,
    LossConfig,
    is_rollout_anchored,
    needs_reference_model,
)
from jaxrl.rl.reductions import (  # noqa: F401
    COVARIANCE_LOSSES,
    LossWeights,
    compute_loss_weights,
    covariance_selection,
    seq_mean_token_sum_norm_weights,
    sequence_mean_weights,
    token_mean_weights,
)
from jaxrl.rl.kl_entropy import abs_with_zero_subgradient, entropy_from_logits, kl_penalty  # noqa: F401
from jaxrl.rl.policy_losses import (  # noqa: F401
    cispo_loss,
    clip_cov_loss,
    dual_clip_loss,
    gspo_loss,
    kl_cov_loss,
    regular_loss,
    sapo_loss,
)
from jaxrl.rl.off_policy import _invalid_rollout_rows, off_policy_correction  # noqa: F401
from jaxrl.rl.registry import get_policy_loss


def _check_shape(name, x, shape):
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (target-aligned like loss_mask), got {x.shape}.")
    return x


def micro_batch_loss(logprobs, old_logprobs, advantages, loss_mask, weights: LossWeights,
                     config: LossConfig, *, rollout_logprobs=None, ref_logprobs=None,
                     entropy=None, is_truncated=None):
    """Loss of one micro-batch (or device shard) as a weighted SUM with mini-batch weights.

    loss = Σ w_policy · ℓ_pg · tis · kept  +  kl_loss_coef · Σ w_seq_tok · kl
           − entropy_loss_coef · Σ w_tok · H
    where ℓ_pg is the per-token loss of `config.policy_loss_type`, tis / kept the off-policy
    correction (if enabled) and w the rows of `compute_loss_weights` of the whole mini-batch.
    Summing this over micro-batches (and devices) gives the mini-batch loss and gradient.

    Args:
      logprobs: float [N, T] log π_θ (the differentiable input).
      old_logprobs: float [N, T] log π_old (detached).
      advantages: float [N, T] (e.g. `broadcast_to_tokens(per_trajectory_advantages, loss_mask)`).
      loss_mask: [N, T] bool or 0/1.
      weights: the rows of this micro-batch of `compute_loss_weights(whole mini-batch)`.
      config: LossConfig.
      rollout_logprobs: [N, T] log μ; required by the off-policy correction and cispo-rollout.
      ref_logprobs: [N, T] log π_ref; required iff kl_loss_coef != 0 (also gives the
        `policy_kl` metric when present).
      entropy: [N, T] per-token entropy of π_θ (`entropy_from_logits`); required iff
        entropy_loss_coef != 0 (also gives the `entropy` metric when present).
      is_truncated: [N] bool, stop_reason != "stop"; required iff only_untruncated.
    Non-finite inputs: see the module docstring (masked: never leak; trainer-computed inputs on
    loss tokens: reach the loss; a row with a NaN/inf rollout logprob on a loss token: dropped from
    the policy-gradient term and counted in `invalid_rollout_seq_ratio`).
    Returns:
      (loss: float32 scalar, metrics: dict of float32 scalars). Metrics: loss, policy_loss,
      approx_kl (token mean of k3(π_θ, π_old)), the policy loss's own metrics (clip_ratio,
      clip_ratio_low/high, ratio_mean/max/min, ...), off-policy metrics, policy_kl, kl_loss,
      entropy. Every metric is already normalised by the mini-batch (combine micro-batches by
      summing), except keys ending in `_max` / `_min` (combine by max / min; −inf / +inf when the
      micro-batch has no loss token).
    Raises: ValueError for a shape mismatch, an unknown loss name or a missing required input.
    """
    loss_mask = jnp.asarray(loss_mask)
    if loss_mask.ndim != 2:
        raise ValueError(f"loss_mask must be [N, T], got shape {loss_mask.shape}.")
    shape = loss_mask.shape
    for name, x in (("logprobs", logprobs), ("old_logprobs", old_logprobs), ("advantages", advantages),
                    ("rollout_logprobs", rollout_logprobs), ("ref_logprobs", ref_logprobs),
                    ("entropy", entropy), ("weights.policy", weights.policy), ("weights.token", weights.token),
                    ("weights.sequence_token", weights.sequence_token)):
        _check_shape(name, x, shape)
    _check_shape("weights.sequence", weights.sequence, shape[:1])
    _check_shape("is_truncated", is_truncated, shape[:1])
    loss_fn = get_policy_loss(config.policy_loss_type)

    mask = loss_mask.astype(bool)
    clean = lambda x, m=mask: None if x is None else jnp.where(m, jnp.asarray(x, jnp.float32), 0.0)
    sg = jax.lax.stop_gradient
    lp = clean(logprobs)
    old = sg(clean(old_logprobs))
    adv = sg(clean(advantages))
    # The policy-gradient term's tokens: rows with invalid engine logprobs are dropped from it.
    pg_mask = mask
    if rollout_logprobs is not None:
        invalid_row = _invalid_rollout_rows(rollout_logprobs, mask)
        pg_mask = mask & ~invalid_row[:, None]
    mu = None if rollout_logprobs is None else sg(clean(rollout_logprobs, pg_mask))

    extra = {}
    if config.policy_loss_type in COVARIANCE_LOSSES:
        if weights.selected is None:
            raise ValueError(f"policy_loss_type={config.policy_loss_type!r} needs weights.selected: compute the "
                             "weights with compute_loss_weights(..., old_logprobs=, advantages=, rng=).")
        _check_shape("weights.selected", weights.selected, shape)
        extra["selected"] = jnp.where(pg_mask, weights.selected, 0.0)
    per_token, loss_metrics = loss_fn(lp, old, adv, pg_mask, config, mu, **extra)
    per_token = jnp.where(pg_mask, per_token, 0.0)
    metrics: Dict[str, jax.Array] = {}
    in_loss = pg_mask
    if config.uses_off_policy_correction:
        if mu is None:
            raise ValueError(
                "The off-policy correction (tis_ratio_type / outlier / token / sequence masks) "
                "needs rollout_logprobs."
            )
        factor, kept, opc_metrics = off_policy_correction(old, clean(rollout_logprobs), mask, weights, config,
                                                          is_truncated)
        per_token = jnp.where(kept, per_token * factor, 0.0)
        in_loss = pg_mask & kept
        metrics.update(opc_metrics)
    elif mu is not None:  # the invalid-row guard is always on when μ is given (module docstring)
        metrics["invalid_rollout_seq_ratio"] = jnp.sum(weights.sequence * invalid_row.astype(jnp.float32))
    # The loss's own metrics describe the tokens in the loss term (module docstring, "Metrics"):
    # fractions and max/min count only those; a mean counts a loss token outside the term (dropped
    # row, off-policy mask) at its value at π_θ = π_old, so means stay means (e.g. ratio 1).
    removed = mask & ~in_loss
    neutral = None
    for name, values in loss_metrics.items():  # per-token values -> one number (metric_combine_rule)
        rule = metric_combine_rule(name)
        if rule != "sum":
            masked = jnp.where(in_loss, values, metric_identity(name))
            metrics[name] = jnp.max(masked) if rule == "max" else jnp.min(masked)
        elif _is_mean_metric(name):
            if neutral is None:
                neutral = loss_fn(old, old, adv, pg_mask, config, mu, **extra)[1]
            metrics[name] = jnp.sum(weights.token * jnp.where(in_loss, values, jnp.where(removed, neutral[name], 0.0)))
        else:
            metrics[name] = jnp.sum(weights.token * jnp.where(in_loss, values, 0.0))

    policy_loss = jnp.sum(weights.policy * per_token)
    loss = policy_loss
    metrics["policy_loss"] = policy_loss
    metrics["approx_kl"] = jnp.sum(weights.token * kl_penalty(sg(lp), old, mask, "k3"))

    if needs_reference_model(config) and ref_logprobs is None:
        raise ValueError("use_kl_loss with kl_loss_coef != 0 needs ref_logprobs (or set kl_loss_coef=0).")
    if ref_logprobs is not None:
        kl = kl_penalty(lp, sg(clean(ref_logprobs)), mask, config.kl_estimator_type)
        kl_loss = jnp.sum(weights.sequence_token * kl)
        metrics["policy_kl"] = sg(kl_loss)
        if needs_reference_model(config):
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["kl_loss"] = config.kl_loss_coef * sg(kl_loss)

    if config.entropy_loss_coef != 0.0 and entropy is None:
        raise ValueError("entropy_loss_coef != 0 needs the per-token entropy (or set entropy_loss_coef=0).")
    if entropy is not None:
        mean_entropy = jnp.sum(weights.token * clean(entropy))
        metrics["entropy"] = sg(mean_entropy)
        if config.entropy_loss_coef != 0.0:
            loss = loss - config.entropy_loss_coef * mean_entropy
    metrics["loss"] = loss
    return loss, {k: sg(v) for k, v in metrics.items()}


def minibatch_loss(logprobs, old_logprobs, advantages, loss_mask, config: LossConfig, *,
                   sequence_mask=None, **kwargs):
    """Loss of a whole mini-batch in one call: `micro_batch_loss` with its own weights.

    Convenience for tests and notebooks; the trainer computes the weights once and splits them.
    Keyword arguments are those of `micro_batch_loss`.
    """
    weights = compute_loss_weights(loss_mask, config, sequence_mask)
    return micro_batch_loss(logprobs, old_logprobs, advantages, loss_mask, weights, config, **kwargs)


def _is_mean_metric(name: str) -> bool:
    """A policy-loss metric that is a token MEAN of a quantity (`*_mean`, `*/abs_kl`), as opposed
    to a fraction of tokens (`*_ratio`, `clip_ratio_low/high`) or a max/min."""
    return name.endswith("_mean") or name.endswith("/abs_kl")


def metric_combine_rule(name: str) -> str:
    """How the metric `name` combines over the parts of a mini-batch (micro-batches, shards, loss
    tokens) and over the mini-batches of an RL step: the ONE definition of this rule.

    Returns "max" for names ending in `_max`, "min" for `_min`, else "sum" (such metrics are
    already normalised by the whole mini-batch, so parts add up; over the mini-batches of a step
    the trainer takes their mean).
    """
    if name.endswith("_max"):
        return "max"
    if name.endswith("_min"):
        return "min"
    return "sum"


def metric_identity(name: str) -> float:
    """The neutral element of `metric_combine_rule(name)`: -inf (max), +inf (min) or 0.0 (sum)."""
    return {"max": -jnp.inf, "min": jnp.inf, "sum": 0.0}[metric_combine_rule(name)]


def combine_metrics(a: Dict[str, jax.Array], b: Dict[str, jax.Array]) -> Dict[str, jax.Array]:
    """Combine the metrics of two micro-batches / shards of the same mini-batch.

    Keys combine by `metric_combine_rule`: `_max` by max, `_min` by min, all others by sum (they
    are already normalised by the whole mini-batch). Raises ValueError if the key sets differ.
    """
    if set(a) != set(b):
        raise ValueError(f"combine_metrics needs the same keys; got {sorted(a)} and {sorted(b)}.")
    ops = {"max": jnp.maximum, "min": jnp.minimum, "sum": lambda x, y: x + y}
    return {k: ops[metric_combine_rule(k)](a[k], b[k]) for k in a}


def split_rows(tree, num_micro_batches: int):
    """Split every array of a pytree along axis 0 into `num_micro_batches` equal contiguous parts.

    Returns a list of pytrees. Raises ValueError if a leading dimension is not divisible.
    """
    leaves = [x for x in jax.tree.leaves(tree) if x is not None]
    for x in leaves:
        if x.shape[0] % num_micro_batches:
            raise ValueError(
                f"Cannot split {x.shape[0]} rows into {num_micro_batches} equal micro-batches."
            )
    return [
        jax.tree.map(lambda x, i=i: jnp.split(x, num_micro_batches)[i], tree)
        for i in range(num_micro_batches)
    ]


__all__ = [
    "LossConfig",
    "LossWeights",
    "abs_with_zero_subgradient",
    "combine_metrics",
    "compute_loss_weights",
    "cispo_loss",
    "clip_cov_loss",
    "covariance_selection",
    "dual_clip_loss",
    "entropy_from_logits",
    "gspo_loss",
    "is_rollout_anchored",
    "kl_cov_loss",
    "kl_penalty",
    "metric_combine_rule",
    "metric_identity",
    "micro_batch_loss",
    "minibatch_loss",
    "needs_reference_model",
    "off_policy_correction",
    "regular_loss",
    "sapo_loss",
    "split_rows",
]
