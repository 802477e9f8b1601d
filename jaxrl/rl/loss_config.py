"""The options of the policy objective (:class:`LossConfig`, SkyRL's ``trainer.algorithm.*``
names), their accepted values and clamps, and the two questions the trainer asks of them
(:func:`is_rollout_anchored`, :func:`needs_reference_model`). Re-exported by
:mod:`jaxrl.rl.losses`.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

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
