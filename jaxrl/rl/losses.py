"""Policy losses, mini-batch reductions, KL and entropy terms, off-policy correction.

All arrays are target-aligned [N, T] (docs/architecture.md §3: entry t scores the prediction of token t+1;
T here is the padded width minus one), one trajectory per row, float32 unless stated:
`logprobs` (log π_θ, differentiable), `old_logprobs` (log π_old, recomputed by the trainer),
`advantages`, `loss_mask` (bool or 0/1), optional `rollout_logprobs` (log μ from the rollout
engine), `ref_logprobs` (log π_ref) and `entropy` (per-token entropy of π_θ).

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

import dataclasses
from typing import Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxrl.rl.registry import (
    get_loss_reduction,
    get_policy_loss,
    register_loss_reduction,
    register_policy_loss,
)

LOG_RATIO_CLAMP = 20.0  # SkyRL safe_exp_delta
GSPO_LOG_WEIGHT_MAX = 10.0
KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
TIS_RATIO_TYPES = (None, "token", "sequence")
SEQUENCE_MASK_METRICS = (None, "geometric", "product")
CISPO_ANCHORS = ("old", "rollout")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Options of the policy objective (hashable: pass it as a static jit argument).

    Names follow SkyRL's `trainer.algorithm.*` keys so recipes port over.

    Attributes:
      policy_loss_type: registry name: "regular", "dual_clip", "gspo", "cispo", "sapo", "clip_cov",
        "kl_cov" or a custom one.
      loss_reduction: "token_mean", "sequence_mean", "seq_mean_token_sum_norm" (alias
        "seq_mean_token_sum_norm_global") or a custom registered reduction.
      max_seq_len: the constant of `seq_mean_token_sum_norm` (total sequence budget, e.g. the
        context length). Required for it; never inferred from the padded width.
      eps_clip_low, eps_clip_high: PPO clip range [1 − eps_clip_low, 1 + eps_clip_high]; they are
        independent (e.g. 0.2 / 0.05 or 0.2 / 0.28). 0 <= eps_clip_low < 1, eps_clip_high >= 0.
      clip_ratio_c: dual-clip constant c > 1 (Ye et al. 2020): for A < 0 the loss is capped at
        −c·A.
      cispo_eps_clip_low, cispo_eps_clip_high: CISPO weight clamp [1 − low, 1 + high]; defaults
        1.0 / 4.0, i.e. [0, 5] (ScaleRL's bounds: the ratio truncated from above only, as MiniMax-M1).
        SkyRL's defaults 0.0 / 5.0 give [1, 6], which raises every weight below 1 to 1; pass them
        to reproduce SkyRL (docs/recipes.md).
      cispo_anchor: "old" (r = π/π_old) or "rollout" (r = π/μ; incompatible with TIS).
      sapo_tau_pos, sapo_tau_neg: SAPO gate temperatures for A > 0 and A <= 0 (SkyRL
        `sapo.tau_pos` 1.0, `sapo.tau_neg` 1.05); both > 0.
      clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov: the fraction of loss tokens whose
        gradient is cut (SkyRL `clip_cov.clip_ratio`, 2e-4), drawn uniformly among the tokens whose
        centred covariance lies strictly inside (lb, ub) (1.0, 5.0).
      kl_cov_frac, ppo_kl_coef: KL-Cov: the fraction of loss tokens with the largest covariance
        (SkyRL `kl_cov.kl_cov_frac`, 0.2) that get the penalty ppo_kl_coef·|logπ − logπ_old| (1.0).
      use_kl_loss: add kl_loss_coef · KL(π_θ ‖ π_ref) to the loss (SkyRL `use_kl_loss`); the term
        is on iff use_kl_loss and kl_loss_coef != 0. Off when the KL is in the reward instead.
      kl_loss_coef: coefficient of the KL(π_θ ‖ π_ref) loss term; 0 disables it (and the ref model).
      kl_estimator_type: "k1", "k2", "k3" or "abs" (see `kl_penalty`).
      entropy_loss_coef: coefficient of the entropy bonus (loss −= coef · entropy); 0 disables it.
      tis_ratio_type: None, "token" or "sequence" truncated importance sampling between π_old and
        μ (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL").
      token_tis_ratio_clip_high, sequence_tis_ratio_clip_high: TIS caps (SkyRL defaults 2 and 5).
      only_untruncated: apply TIS and the off-policy masks only to rows whose `is_truncated` is
        False (the `is_truncated` input is then required); config key
        `trainer.algorithm.off_policy_correction.only_untruncated` (not in SkyRL).
      outlier_token_is_threshold_low / _high: drop a whole row if any loss token has
        ρ = π_old/μ below low / above high (either may be None).
      token_mask_is_threshold_low / _high: (both or neither) drop single tokens with ρ outside
        [low, high] (IcePop).
      sequence_mask_metric: None, "geometric" (drop a row whose geometric-mean ρ is outside
        [geo_mask_low, geo_mask_high]) or "product" (product of ρ outside
        [product_mask_low, product_mask_high]).
    """

    policy_loss_type: str = "regular"
    loss_reduction: str = "token_mean"
    max_seq_len: Optional[int] = None
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    clip_ratio_c: float = 3.0
    cispo_eps_clip_low: float = 1.0
    cispo_eps_clip_high: float = 4.0
    cispo_anchor: str = "old"
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_frac: float = 0.2
    ppo_kl_coef: float = 1.0
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.0
    kl_estimator_type: str = "k3"
    entropy_loss_coef: float = 0.0
    tis_ratio_type: Optional[str] = None
    token_tis_ratio_clip_high: float = 2.0
    sequence_tis_ratio_clip_high: float = 5.0
    only_untruncated: bool = False
    outlier_token_is_threshold_low: Optional[float] = None
    outlier_token_is_threshold_high: Optional[float] = None
    token_mask_is_threshold_low: Optional[float] = None
    token_mask_is_threshold_high: Optional[float] = None
    sequence_mask_metric: Optional[str] = None
    geo_mask_low: float = 0.99
    geo_mask_high: float = 1.01
    product_mask_low: float = 0.5
    product_mask_high: float = 2.0

    def __post_init__(self):
        if self.loss_reduction == "seq_mean_token_sum_norm_global":
            object.__setattr__(self, "loss_reduction", "seq_mean_token_sum_norm")
        if self.loss_reduction == "seq_mean_token_sum_norm":
            if self.max_seq_len is None:
                raise ValueError(
                    "loss_reduction='seq_mean_token_sum_norm' needs max_seq_len: set it to the "
                    "constant sequence budget (e.g. the model context length), not the padded width."
                )
        if self.max_seq_len is not None and (
            isinstance(self.max_seq_len, bool) or not isinstance(self.max_seq_len, int) or self.max_seq_len < 1
        ):
            raise ValueError(f"max_seq_len must be a positive int, got {self.max_seq_len!r}.")
        if not 0.0 <= self.eps_clip_low < 1.0:
            raise ValueError(f"eps_clip_low must be in [0, 1), got {self.eps_clip_low}.")
        if self.eps_clip_high < 0.0:
            raise ValueError(f"eps_clip_high must be >= 0, got {self.eps_clip_high}.")
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}.")
        if not 0.0 <= self.cispo_eps_clip_low <= 1.0 or self.cispo_eps_clip_high < 0.0:
            raise ValueError(
                "cispo_eps_clip_low must be in [0, 1] and cispo_eps_clip_high >= 0, got "
                f"{self.cispo_eps_clip_low}, {self.cispo_eps_clip_high}."
            )
        _check_choice("cispo_anchor", self.cispo_anchor, CISPO_ANCHORS)
        _check_choice("kl_estimator_type", self.kl_estimator_type, KL_ESTIMATORS)
        _check_choice("tis_ratio_type", self.tis_ratio_type, TIS_RATIO_TYPES)
        _check_choice("sequence_mask_metric", self.sequence_mask_metric, SEQUENCE_MASK_METRICS)
        if (self.token_mask_is_threshold_low is None) != (self.token_mask_is_threshold_high is None):
            raise ValueError(
                "token_mask_is_threshold_low and token_mask_is_threshold_high must be set together."
            )
        if self.token_tis_ratio_clip_high <= 0 or self.sequence_tis_ratio_clip_high <= 0:
            raise ValueError("token_tis_ratio_clip_high and sequence_tis_ratio_clip_high must be > 0.")
        if self.sapo_tau_pos <= 0 or self.sapo_tau_neg <= 0:
            raise ValueError(f"sapo_tau_pos and sapo_tau_neg must be > 0, got {self.sapo_tau_pos}, {self.sapo_tau_neg}.")
        if not 0.0 < self.clip_cov_ratio <= 1.0:
            raise ValueError(f"clip_cov_ratio must be in (0, 1], got {self.clip_cov_ratio}.")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got {self.clip_cov_lb}, {self.clip_cov_ub}.")
        if not 0.0 < self.kl_cov_frac <= 1.0:
            raise ValueError(f"kl_cov_frac must be in (0, 1], got {self.kl_cov_frac}.")
        if self.ppo_kl_coef < 0.0:
            raise ValueError(f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}.")
        for name in ("outlier_token_is_threshold_low", "outlier_token_is_threshold_high",
                     "token_mask_is_threshold_low", "token_mask_is_threshold_high"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 (a bound on the ratio π_old/μ) or None, got {value}.")
        for low, high in (("outlier_token_is_threshold_low", "outlier_token_is_threshold_high"),
                          ("token_mask_is_threshold_low", "token_mask_is_threshold_high"),
                          ("geo_mask_low", "geo_mask_high"), ("product_mask_low", "product_mask_high")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and not 0 <= lo < hi:
                raise ValueError(f"{low} must be >= 0 and below {high}, got {lo} and {hi}.")
        if self.policy_loss_type == "cispo" and self.cispo_anchor == "rollout" and self.tis_ratio_type:
            raise ValueError(
                "cispo with cispo_anchor='rollout' already weights by π/μ; set tis_ratio_type=None "
                "(TIS would double-count the rollout correction)."
            )

    @property
    def uses_off_policy_correction(self) -> bool:
        """True when any TIS factor or off-policy mask is enabled (rollout_logprobs required)."""
        return (
            self.tis_ratio_type is not None
            or self.outlier_token_is_threshold_low is not None
            or self.outlier_token_is_threshold_high is not None
            or self.token_mask_is_threshold_low is not None
            or self.sequence_mask_metric is not None
        )


def _check_choice(field, value, choices):
    if value not in choices:
        raise ValueError(f"{field} must be one of {choices}, got {value!r}.")


def is_rollout_anchored(config: LossConfig) -> bool:
    """True when the objective corrects for trajectories sampled by a rollout policy μ other than
    π_old (asynchronous RL, where μ is up to `max_staleness_steps` versions older): truncated
    importance sampling of π_old / μ (`tis_ratio_type`, Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"), or CISPO with its ratio anchored on
    μ (`cispo_anchor="rollout"`). SkyRL's fully-async trainer asserts the same (issue #1315)."""
    return config.tis_ratio_type is not None or (config.policy_loss_type == "cispo"
                                                 and config.cispo_anchor == "rollout")


def needs_reference_model(config: LossConfig) -> bool:
    """True iff the loss has a KL-to-reference term (use_kl_loss and kl_loss_coef != 0)."""
    return bool(config.use_kl_loss) and float(config.kl_loss_coef) != 0.0


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


# --------------------------------------------------------------------------------------------
# Policy losses. Inputs are sanitised (finite, 0 where masked); see register_policy_loss.
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# KL, entropy, off-policy correction
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# The micro-batch loss
# --------------------------------------------------------------------------------------------


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
