"""The options of the policy objective (:class:`LossConfig`, SkyRL's ``trainer.algorithm.*``
names), their accepted values and clamps, and the two questions the trainer asks of them
(:func:`is_rollout_anchored`, :func:`needs_reference_model`). Re-exported by
:mod:`jaxrl.rl.losses`.
"""
from __future__ import annotations

from typing import Optional  # noqa: F401  (the generated fields' annotations name it)

from jaxrl.config.algorithm import ALGORITHM
from jaxrl.config.field import schema_dataclass

LOG_RATIO_CLAMP = 20.0  # SkyRL safe_exp_delta
GSPO_LOG_WEIGHT_MAX = 10.0
_CHOICES = {f.attr: f.choices for f in ALGORITHM if f.owner == "loss"}
KL_ESTIMATORS = _CHOICES["kl_estimator_type"]
TIS_RATIO_TYPES = (None, *_CHOICES["tis_ratio_type"])
SEQUENCE_MASK_METRICS = (None, *_CHOICES["sequence_mask_metric"])
CISPO_ANCHORS = _CHOICES["cispo_anchor"]


@schema_dataclass(ALGORITHM, "loss")
class LossConfig:
    """Options of the policy objective (hashable: pass it as a static jit argument).

    Its fields are the `trainer.algorithm` keys declared with owner "loss" in
    jaxrl/config/algorithm.py: each field's type, default (the config default; an "off" value is
    None here) and bounds or choices are that declaration's, checked by `Field.problem_with`
    before the cross-field checks below. Names follow SkyRL's `trainer.algorithm.*` keys so
    recipes port over; the field of `trainer.algorithm.sapo.tau_pos` is `sapo_tau_pos`, of
    `clip_cov.clip_ratio` `clip_cov_ratio`, of any other key its last part.

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

    def __post_init__(self):  # after every field's own check (`schema_dataclass`)
        if self.loss_reduction == "seq_mean_token_sum_norm_global":
            object.__setattr__(self, "loss_reduction", "seq_mean_token_sum_norm")
        if self.loss_reduction == "seq_mean_token_sum_norm":
            if self.max_seq_len is None:
                raise ValueError(
                    "loss_reduction='seq_mean_token_sum_norm' needs max_seq_len: set it to the "
                    "constant sequence budget (e.g. the model context length), not the padded width."
                )
        if (self.token_mask_is_threshold_low is None) != (self.token_mask_is_threshold_high is None):
            raise ValueError(
                "token_mask_is_threshold_low and token_mask_is_threshold_high must be set together."
            )
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got {self.clip_cov_lb}, {self.clip_cov_ub}.")
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
    """Raises ValueError unless `value` is one of `choices` (kl_penalty's estimator argument)."""
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
