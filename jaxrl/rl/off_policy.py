"""Off-policy correction between the trainer's π_old and the rollout engine's μ: truncated
importance sampling (token / sequence), the outlier-token, token (IcePop) and sequence masks,
their metrics, and the guard that drops rows with non-finite rollout logprobs
(:func:`off_policy_correction`; the rules in the :mod:`jaxrl.rl.losses` docstring). Re-exported
by :mod:`jaxrl.rl.losses`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.rl.loss_config import LOG_RATIO_CLAMP, LossConfig
from jaxrl.rl.reductions import LossWeights


def _invalid_rollout_rows(rollout_logprobs, mask):
    """[N] bool: rows with a NaN/inf rollout logprob on a loss token (module docstring)."""
    return jnp.any(mask & ~jnp.isfinite(jnp.asarray(rollout_logprobs, jnp.float32)), axis=1)


def _ratio_metrics(rho, mask, counted, weights):
    """is_ratio_mean/max/min: max/min over `mask`; the mean over all loss tokens with ρ := 1 outside
    `mask` (`counted` = the loss tokens, e.g. including rows dropped as invalid)."""
    return {
        "is_ratio_mean": jnp.sum(weights.token * jnp.where(mask, rho, jnp.where(counted, 1.0, 0.0))),
        "is_ratio_max": jnp.max(jnp.where(mask, rho, -jnp.inf)),
        "is_ratio_min": jnp.min(jnp.where(mask, rho, jnp.inf)),
    }


def off_policy_correction(old_logprobs, rollout_logprobs, loss_mask, weights: LossWeights,
                          config: LossConfig, is_truncated=None):
    """TIS factors and off-policy masks between the trainer's π_old and the rollout engine's μ.

    Uses ρ_t = π_old/μ = exp(clamp(logπ_old − logμ, ±20)) (never π_θ/μ), detached. Order as in
    SkyRL `compute_off_policy_correction`:
      1. outlier-token sequence mask: drop a row if any loss token has ρ < low or ρ > high;
      2. token mask (IcePop): drop tokens with ρ outside [low, high];
      3. TIS factor: "token" w_t = min(ρ_t, cap); "sequence" w_i = min(exp(clamp(Σ_t m_t log ρ_t,
         ±20)), cap) over the tokens kept by 1–2, with the UNCLAMPED log ρ_t in the sum (SkyRL
         clamps the sum, not the terms);
      4. sequence mask: "geometric" g_i = exp(clamp(Σ m log ρ / max(Σ m, 1), ±20)) kept iff in
         [geo_mask_low, geo_mask_high]; "product" exp(clamp(Σ m log ρ, ±20)) in
         [product_mask_low, product_mask_high] (unclamped terms, as 3); a row that 1–2 already
         emptied is not dropped (or counted) again.
    Metrics count only what is still in the loss at their stage: token_mask_ratio skips the
    tokens of rows the outlier mask dropped; tis_token_clip_high_ratio / tis_seq_clip_high_ratio
    count capped tokens / rows that every mask kept (a capped token the token mask dropped is not
    "capped in the loss"). Fractions are of the mini-batch's loss tokens / rows (`weights`), so
    they sum over micro-batches (SkyRL divides by the tokens its masks kept).
    With `only_untruncated`, rows with is_truncated=True get factor 1 and are never
    dropped by 1, 2 or 4. A row with a NaN/inf rollout logprob on a loss token is always dropped
    (kept_mask False, factor 1) and counted in `invalid_rollout_seq_ratio` (module docstring).

    Args: old_logprobs, rollout_logprobs float [N, T]; loss_mask [N, T]; weights (this
      micro-batch's rows, for the metrics); config; is_truncated optional bool [N].
    Returns: (factor [N, T] float32, kept_mask [N, T] bool, metrics dict of scalars, all
      micro-batch-summable; keys ending in _max/_min combine by max/min).
    Raises: ValueError if only_untruncated and is_truncated is None.
    """
    loss_tokens = jnp.asarray(loss_mask).astype(bool)
    invalid_row = _invalid_rollout_rows(rollout_logprobs, loss_tokens)
    mask = loss_tokens & ~invalid_row[:, None]
    raw_log_rho = jax.lax.stop_gradient(jnp.where(mask, jnp.asarray(old_logprobs, jnp.float32), 0.0) - jnp.where(
        mask, jnp.asarray(rollout_logprobs, jnp.float32), 0.0))
    log_rho = jnp.clip(raw_log_rho, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = jnp.exp(log_rho)
    if config.only_untruncated:
        if is_truncated is None:
            raise ValueError(
                "only_untruncated=True needs is_truncated [N] (stop_reason != 'stop')."
            )
        row_applies = ~jnp.asarray(is_truncated).astype(bool) & ~invalid_row
    else:
        row_applies = ~invalid_row
    applies = mask & row_applies[:, None]
    tok = lambda x: jnp.sum(weights.token * x.astype(jnp.float32))
    seq = lambda x: jnp.sum(weights.sequence * x.astype(jnp.float32))
    metrics = _ratio_metrics(rho, mask, loss_tokens, weights)
    metrics["invalid_rollout_seq_ratio"] = seq(invalid_row)
    keep = mask
    low, high = config.outlier_token_is_threshold_low, config.outlier_token_is_threshold_high
    if low is not None or high is not None:
        over = jnp.any(applies & (rho > high), axis=1) if high is not None else jnp.zeros(mask.shape[:1], bool)
        under = jnp.any(applies & (rho < low), axis=1) if low is not None else jnp.zeros(mask.shape[:1], bool)
        dropped = over | under
        keep = keep & ~dropped[:, None]
        metrics.update(outlier_seq_masked_ratio=seq(dropped), outlier_seq_over_high_ratio=seq(over),
                       outlier_seq_under_low_ratio=seq(under))
    if config.token_mask_is_threshold_low is not None:
        bad = applies & ((rho < config.token_mask_is_threshold_low) | (rho > config.token_mask_is_threshold_high))
        metrics["token_mask_ratio"] = tok(bad & keep)  # tokens of rows the outlier mask dropped are gone already
        keep = keep & ~bad
    factor = jnp.ones(mask.shape, jnp.float32)
    # Sequence quantities sum the UNCLAMPED log ρ of the kept tokens and clamp the sum (SkyRL
    # safe_exp_delta of the sum): a single token with |log ρ| > 20 counts with its full weight.
    sum_log_rho = jnp.sum(jnp.where(keep, raw_log_rho, 0.0), axis=1)
    seq_log_rho = jnp.clip(sum_log_rho, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    capped_tokens = capped_rows = None
    if config.tis_ratio_type == "token":
        cap = config.token_tis_ratio_clip_high
        factor = jnp.where(applies, jnp.minimum(rho, cap), 1.0)
        capped_tokens = applies & (rho > cap)
    elif config.tis_ratio_type == "sequence":
        cap = config.sequence_tis_ratio_clip_high
        seq_rho = jnp.exp(seq_log_rho)
        factor = jnp.broadcast_to(jnp.where(row_applies, jnp.minimum(seq_rho, cap), 1.0)[:, None], mask.shape)
        capped_rows = row_applies & (seq_rho > cap)
    if config.sequence_mask_metric is not None:
        if config.sequence_mask_metric == "geometric":
            count = jnp.maximum(jnp.sum(keep, axis=1), 1)
            value = jnp.exp(jnp.clip(sum_log_rho / count, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
            lo, hi, name = config.geo_mask_low, config.geo_mask_high, "geo"
        else:
            value = jnp.exp(seq_log_rho)
            lo, hi, name = config.product_mask_low, config.product_mask_high, "product"
        alive = row_applies & jnp.any(keep, axis=1)  # rows an earlier mask emptied are not dropped again
        over, under = alive & (value > hi), alive & (value < lo)
        keep = keep & ~(over | under)[:, None]
        metrics.update({f"{name}_sequence_mask_masked_ratio": seq(over | under),
                        f"{name}_sequence_mask_over_high_ratio": seq(over),
                        f"{name}_sequence_mask_under_low_ratio": seq(under)})
    # The TIS metrics count only what is still in the loss after every mask.
    if capped_tokens is not None:
        metrics["tis_token_clip_high_ratio"] = tok(capped_tokens & keep)
    if capped_rows is not None:
        metrics["tis_seq_clip_high_ratio"] = seq(capped_rows & jnp.any(keep, axis=1))
    return jax.lax.stop_gradient(factor), keep, metrics
