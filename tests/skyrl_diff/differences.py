"""The written list of intentional differences between jaxrl.rl and SkyRL 0.3.0 (docs/recipes.md, "Differences
from SkyRL's code"), each with the minimal input that shows it.

Every entry is asserted AS a difference by test_skyrl_diff.py::test_difference: on its input, jaxrl's output is
`jaxrl` and SkyRL's (its own code, float32) is `skyrl` — both values worked out by hand, in the comments — and the
two disagree. A change on either side (a fix in SkyRL, a change of jaxrl's convention) fails that test, and the
entry then moves to the agreeing pairs (cases.py) or is rewritten. `kind`: "skyrl bug" (SkyRL's result is wrong
for what its own docs say), "convention" (both defensible; jaxrl's is documented), "default" (a default value).
"""
from __future__ import annotations

import math

import numpy as np

from skyrl_diff.cases import loss_opts

E = math.e


def _case(pair, op, opts, x):
    return {"id": f"difference/{pair}", "pair": f"difference/{pair}", "op": op, "opts": opts, "x": x}


def build():
    d = []

    def add(name, kind, title, case, key, jaxrl, skyrl, where=None, skyrl_rtol=1e-5, skyrl_float64=None):
        d.append({"name": name, "kind": kind, "title": title, "case": _case(name, *case), "key": key,
                  "jaxrl": jaxrl, "skyrl": skyrl, "where": where, "skyrl_rtol": skyrl_rtol,
                  "skyrl_float64": skyrl_float64})

    one = lambda *v: np.array([list(v)], np.float64)  # noqa: E731  a one-row [1, T] array

    # 1. GRPO, a group of six equal rewards 0.6 in float32: SkyRL's torch.mean leaves a 1-ulp residue (-6e-8), its
    # std is 6.5e-8, and (r - mean)/(std + 1e-6) = 0.056 for every member; in float64 it is 0 (as jaxrl's, which
    # centres on the group's largest reward: exactly 0).
    add("grpo_equal_rewards_residue", "skyrl bug",
        "GRPO on a group of equal rewards: SkyRL's float32 mean leaves a residue that (std + 1e-6) blows up",
        ("adv", {"estimator": "grpo", "grpo_norm_by_std": True},
         {"token_rewards": np.full((6, 1), 0.6), "response_mask": np.ones((6, 1)), "index": np.zeros(6, np.int64)}),
        "advantages", np.zeros((6, 1)), np.full((6, 1), 0.05595), skyrl_rtol=1e-2, skyrl_float64=np.zeros((6, 1)))

    # 2. clip_cov, token_mean over 2 tokens, log π = log π_old = [-1, -3], A = [2, -1], every candidate cut (clip
    # ratio 1), bounds (1, 5). Covariance with A: (A - 0.5)(log π + 2) = [1.5, 1.5], both inside: jaxrl cuts both,
    # loss 0. SkyRL's A arrives pre-scaled by 1/2: covariance [0.75, 0.75] < 1, nothing cut: loss -(1 - 0.5) = -0.5.
    add("clip_cov_prescaled_covariance", "skyrl bug",
        "clip_cov: SkyRL compares the covariance bounds with advantages already divided by the loss reduction",
        ("loss", loss_opts("clip_cov", "token_mean", clip_cov=(1.0, 1.0, 5.0)),
         {"logprobs": one(-1, -3), "old_logprobs": one(-1, -3), "advantages": one(2, -1), "loss_mask": one(1, 1)}),
        "loss", 0.0, -0.5)

    # 3. kl_cov, token_mean over 3 tokens: log π = [-1, -2, -4], log π_old = [-1.5, -2, -4], A = [1, -1, 0.5],
    # kl_cov_frac 0.34 (k = 1: token 0, covariance 0.83 by π_old, 1.11 by π), coef 1. Per token ℓ = -A·r + s·|Δ|:
    # [-e^0.5 + 0.5, 1, -0.5]; jaxrl: their mean -0.21624. SkyRL: -A/3·r summed plus the unscaled penalty 0.5:
    # -(e^0.5 - 1 + 0.5)/3 + 0.5 = 0.11709.
    add("kl_cov_penalty_token_sum", "skyrl bug",
        "kl_cov: SkyRL adds ppo_kl_coef·|Δ| unscaled by the loss reduction (a token sum inside a token mean)",
        ("loss", loss_opts("kl_cov", "token_mean", kl_cov=(0.34, 1.0)),
         {"logprobs": one(-1, -2, -4), "old_logprobs": one(-1.5, -2, -4), "advantages": one(1, -1, 0.5),
          "loss_mask": one(1, 1, 1)}),
        "loss", (-math.exp(0.5) + 0.5 + 1 - 0.5) / 3, -(math.exp(0.5) - 1 + 0.5) / 3 + 0.5)

    # 4. clip_cov with token TIS (cap 2): SkyRL's covariance losses never apply the off-policy correction (its
    # config validation refuses the combination; the function ignores it). log π = log π_old = [-1, -1], A = [1, 1],
    # log μ = [-2, -1]: ρ = [e, 1], factor [2, 1]; bounds (10, 20) cut nothing. jaxrl: mean(-[2, 1]) = -1.5;
    # SkyRL: -1.
    add("covariance_losses_ignore_off_policy_correction", "skyrl bug",
        "clip_cov / kl_cov: SkyRL ignores the off-policy correction (TIS factor and masks)",
        ("loss", loss_opts("clip_cov", "token_mean", clip_cov=(1.0, 10.0, 20.0),
                           opc={"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0}),
         {"logprobs": one(-1, -1), "old_logprobs": one(-1, -1), "advantages": one(1, 1), "loss_mask": one(1, 1),
          "rollout_logprobs": one(-2, -1)}),
        "loss", -1.5, -1.0)

    # 5. Outcome estimators' returns: SkyRL returns the advantages; jaxrl the discounted reward-to-go (what a critic
    # would regress on). GRPO on rewards [1, 0] (one group, one token each): advantages ±0.5/(0.70711 + 1e-6).
    add("outcome_returns", "convention",
        "grpo / rloo / maxrl returns: SkyRL's are the advantages, jaxrl's the discounted rewards-to-go",
        ("adv", {"estimator": "grpo"},
         {"token_rewards": np.array([[1.0], [0.0]]), "response_mask": np.ones((2, 1)), "index": np.zeros(2, np.int64)}),
        "returns", np.array([[1.0], [0.0]]), np.array([[0.5], [-0.5]]) / (math.sqrt(0.5) + 1e-6))

    # 6. reinforce++ whitens over the loss tokens (jaxrl) or all response tokens (SkyRL: its estimators see no loss
    # mask; in multi-turn the response holds observation tokens). γ = 0.5, one row of 3 response tokens, reward 1 on
    # the last, loss mask [1, 0, 1]: returns [0.25, 0.5, 1]. jaxrl over [0.25, 1]: ±1/sqrt(2) = ∓0.70711 (token 0
    # first); SkyRL over all three: (0.25 - 0.58333)/0.38188 = -0.87287 and (1 - 0.58333)/0.38188 = 1.09109.
    add("reinforce_pp_whitening_tokens", "convention",
        "reinforce++ / gae whiten over the loss tokens (SkyRL: over every response token)",
        ("adv", {"estimator": "reinforce++", "gamma": 0.5},
         {"token_rewards": one(0, 0, 1), "response_mask": one(1, 1, 1), "loss_mask": one(1, 0, 1),
          "index": np.zeros(1, np.int64)}),
        "advantages", one(-1 / math.sqrt(2), 1 / math.sqrt(2)), one(-0.872872, 1.091089),
        where=np.array([[True, False, True]]))

    # 7. GAE off the response: SkyRL whitens every column and leaves the padding's value (no loss reads it); jaxrl
    # writes 0. Right-aligned row, mask [0, 1, 1], rewards [0, 0, 1], values [0.5, 0.2, 0.4], γ = λ = 1: raw
    # A = [0.5, 0.8, 0.6]; whitened with the response's mean 0.7 and std 0.14142: padding (0.5 - 0.7)/0.14142.
    add("gae_padding_advantages", "convention",
        "gae advantages off the response: SkyRL leaves whitened values there, jaxrl 0",
        ("adv", {"estimator": "gae", "gamma": 1.0, "lambd": 1.0},
         {"token_rewards": one(0, 0, 1), "response_mask": one(0, 1, 1), "values": one(0.5, 0.2, 0.4),
          "index": np.zeros(1, np.int64)}),
        "advantages", np.array([0.0]), np.array([-0.2 / math.sqrt(0.02)]), where=np.array([[True, False, False]]))

    # 8. GAE on a left-aligned row (response, then padding): SkyRL bootstraps V from the padding column after the
    # response (its layout is right-aligned); jaxrl stops at the response's end. Mask [1, 1, 0], rewards [0, 1, 0],
    # values [0.2, 0.4, 0.5], γ = 1, λ = 0.5. jaxrl: δ = [0.2, 0.6], A = [0.5, 0.6], returns [0.7, 1.0]. SkyRL:
    # δ = [0.2, 1.1, -0.5], A2 = -0.5, A1 = 1.1 - 0.25 = 0.85, A0 = 0.2 + 0.425 = 0.625, returns [0.825, 1.25].
    add("gae_left_aligned_rows", "convention",
        "gae needs right-aligned rows in SkyRL (it bootstraps from the column after the response, padding or not)",
        ("adv", {"estimator": "gae", "gamma": 1.0, "lambd": 0.5},
         {"token_rewards": one(0, 1, 0), "response_mask": one(1, 1, 0), "values": one(0.2, 0.4, 0.5),
          "index": np.zeros(1, np.int64)}),
        "returns", np.array([0.7, 1.0]), np.array([0.825, 1.25]), where=np.array([[True, True, False]]))

    # 9. reinforce++ with a single response token in the batch: SkyRL raises (Bessel's n - 1 = 0); jaxrl gives 0.
    add("whitening_single_token", "convention",
        "reinforce++ / gae on a batch with one response token: SkyRL raises, jaxrl's advantage is 0",
        ("adv", {"estimator": "reinforce++", "gamma": 1.0},
         {"token_rewards": one(0, 1), "response_mask": one(0, 1), "index": np.zeros(1, np.int64)}),
        "advantages", np.array([0.0]), "ValueError: The sum of the mask is one, which can cause a division by zero.",
        where=np.array([[False, True]]))

    # 10. clip_cov's ratio: SkyRL exp(Δ) unclamped, jaxrl exp(clamp(Δ, ±20)) like every other loss. One token,
    # Δ = 25, A = -1 (the clipped branch is r·1), plain sum, bounds that cut nothing: e^20 against e^25.
    add("clip_cov_ratio_clamp", "convention",
        "clip_cov's ratio is clamped at exp(±20) in jaxrl (as every other loss); SkyRL's is not",
        ("loss", loss_opts("clip_cov", "sum", clip_cov=(1.0, 10.0, 20.0)),
         {"logprobs": one(-1.0), "old_logprobs": one(-26.0), "advantages": one(-1.0), "loss_mask": one(1.0)}),
        "loss", math.exp(20.0), math.exp(25.0))

    # 11a. The loss's own metrics count only the tokens in the loss (jaxrl, issue 25 §2: a metric never counts what
    # a mask removed); SkyRL computes them before the off-policy masks. regular, two rows of one token: row 0 has
    # r = 2 (clipped at 1.2, A = 1) and ρ = 2, which the outlier mask (high 1.5) drops; row 1 r = 1. jaxrl's
    # clip_ratio 0/2 = 0, SkyRL's 1/2.
    outlier = {"outlier_token_is_threshold_high": 1.5}
    add("loss_metrics_skip_masked_tokens", "convention",
        "the loss's own metrics (clip_ratio, ...) count only tokens still in the loss; SkyRL's count tokens the "
        "off-policy masks drop",
        ("loss", loss_opts("regular", "token_mean", opc=outlier),
         {"logprobs": np.log([[2.0], [1.0]]), "old_logprobs": np.zeros((2, 1)), "advantages": np.ones((2, 1)),
          "loss_mask": np.ones((2, 1)), "rollout_logprobs": -np.log([[2.0], [1.0]])}),
        "metric/clip_ratio", 0.0, 0.5)

    # 11b. TIS metrics after the sequence mask: jaxrl counts capped rows / tokens that every mask kept; SkyRL's
    # are computed before the sequence mask. One token, ρ = 3: sequence TIS cap 2 caps it, the geometric mask
    # [0.9, 1.1] then drops the row. jaxrl 0, SkyRL 1.
    seq_geo = {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 2.0, "sequence_mask_metric": "geometric",
               "geo_mask_low": 0.9, "geo_mask_high": 1.1}
    add("tis_metrics_after_sequence_mask", "convention",
        "tis_*_clip_high_ratio count only what the sequence mask kept; SkyRL's count rows it drops afterwards",
        ("opc", {"opc": seq_geo, "jaxrl_cfg": loss_opts("regular", opc=seq_geo)["jaxrl_cfg"]},
         {"old_logprobs": np.log([[3.0]]), "rollout_logprobs": np.zeros((1, 1)), "loss_mask": np.ones((1, 1))}),
        "metric/tis_seq_clip_high_ratio", 0.0, 1.0)

    # 12. is_ratio_min: SkyRL takes the min of ρ·mask, so any masked position makes it 0; jaxrl's is over loss
    # tokens. Mask [1, 0], ρ = [e^0.5, 1] (token TIS on to enable the correction).
    add("is_ratio_min_masked", "convention",
        "is_ratio_min / is_ratio_max are over loss tokens in jaxrl; SkyRL's count masked positions as ρ = 0",
        ("opc", {"opc": {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0},
                 "jaxrl_cfg": loss_opts("regular", opc={"tis_ratio_type": "token",
                                                        "token_tis_ratio_clip_high": 2.0})["jaxrl_cfg"]},
         {"old_logprobs": one(-1.0, -1.0), "rollout_logprobs": one(-1.5, -1.0), "loss_mask": one(1, 0)}),
        "metric/is_ratio_min", math.exp(0.5), 0.0)

    # 13. Denominator of token metrics after a mask: SkyRL divides tis_token_clip_high_ratio by the tokens the
    # earlier masks left, jaxrl by the mini-batch's loss tokens (every jaxrl metric sums over micro-batches). IcePop
    # [0.5, 2] drops ρ = 0.1, token TIS cap 1.5 caps ρ = 1.8: SkyRL 1/1, jaxrl 1/2.
    icepop_tis = {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.5, "token_mask_is_threshold_low": 0.5,
                  "token_mask_is_threshold_high": 2.0}
    add("token_metric_denominator", "convention",
        "token metrics after a mask (tis_token_clip_high_ratio): jaxrl divides by the loss tokens, SkyRL by those kept",
        ("opc", {"opc": icepop_tis, "jaxrl_cfg": loss_opts("regular", opc=icepop_tis)["jaxrl_cfg"]},
         {"old_logprobs": np.log([[1.8, 0.1]]), "rollout_logprobs": np.zeros((1, 2)), "loss_mask": one(1, 1)}),
        "metric/tis_token_clip_high_ratio", 0.5, 1.0)

    # 14. kl_cov / clip_cov select their tokens once per mini-batch from π_old (jaxrl) or per micro-batch from the
    # current π (SkyRL); they agree at the first update (π = π_old). log π = [-1, -2, -4], log π_old = [-4, -2, -1.5],
    # A = [1, -1, 0.5], kl_cov_frac 0.34 (k = 1), coef 1, plain sum. By π token 0 is selected (SkyRL), by π_old
    # token 2 (jaxrl). -A·r = [-e^3, 1, -0.5·e^-2.5]; SkyRL adds |Δ0| = 3, jaxrl |Δ2| = 2.5.
    base = -math.exp(3.0) + 1.0 - 0.5 * math.exp(-2.5)
    add("covariance_selection_from_old", "convention",
        "clip_cov / kl_cov choose their tokens from π_old once per mini-batch (SkyRL: from π, per micro-batch)",
        ("loss", loss_opts("kl_cov", "sum", kl_cov=(0.34, 1.0)),
         {"logprobs": one(-1, -2, -4), "old_logprobs": one(-4, -2, -1.5), "advantages": one(1, -1, 0.5),
          "loss_mask": one(1, 1, 1)}),
        "loss", base + 2.5, base + 3.0)

    # 15. A NaN log-prob at a masked position: SkyRL's masked sum (ℓ·mask) makes the loss NaN (0·NaN); jaxrl
    # replaces masked entries before any arithmetic. regular, mask [1, 0], log π = [-1, NaN], log π_old = [-1, -1],
    # A = 1: jaxrl -1 (token mean of -r·A), SkyRL NaN.
    add("nan_at_masked_position", "skyrl bug",
        "a NaN at a masked position reaches SkyRL's policy loss (0·NaN); jaxrl's never",
        ("loss", loss_opts("regular", "token_mean"),
         {"logprobs": one(-1.0, np.nan), "old_logprobs": one(-1.0, -1.0), "advantages": one(1.0, 1.0),
          "loss_mask": one(1, 0)}),
        "loss", -1.0, np.nan)

    # 16. rloo_n with group_advantage_min_size 3 (jaxrl's option; SkyRL's rloo has none): a group of 2 gets 0 in
    # jaxrl, r - the other's reward in SkyRL. Rewards [1, 0].
    add("rloo_n_min_group_size", "convention",
        "rloo_n's group_advantage_min_size > 2 zeroes small groups (jaxrl's option; SkyRL's rloo has none)",
        ("adv", {"estimator": "rloo", "jaxrl_estimator": "rloo_n", "group_advantage_min_size": 3},
         {"token_rewards": np.array([[1.0], [0.0]]), "response_mask": np.ones((2, 1)), "index": np.zeros(2, np.int64)}),
        "advantages", np.zeros((2, 1)), np.array([[1.0], [-1.0]]))

    # 17. Metrics SkyRL logs and jaxrl does not: clip_ratio 0.0 for sapo and kl_cov (nothing clips), is_ratio_std.
    add("constant_clip_ratio", "convention",
        "sapo / kl_cov: SkyRL logs clip_ratio = 0.0 (nothing clips); jaxrl reports no clip_ratio (also no is_ratio_std)",
        ("loss", loss_opts("sapo", "token_mean"),
         {"logprobs": one(-1.0, -2.0), "old_logprobs": one(-1.5, -2.0), "advantages": one(1.0, -1.0),
          "loss_mask": one(1, 1)}),
        "metric/clip_ratio", None, 0.0)

    # 18. Defaults: every trainer.algorithm key jaxrl shares with SkyRL's AlgorithmConfig (SkyRL's from its
    # config.py, jaxrl's from jaxrl.config.base_config) is equal except these (jaxrl value, SkyRL value). jaxrl
    # writes SkyRL's None as '' or 0 (ml_collections keys keep one type); those compare as None.
    d.append({"name": "defaults", "kind": "default", "title": "defaults that differ", "case": _case(
        "defaults", "defaults", {}, {}), "key": "defaults", "where": None, "skyrl_rtol": 0.0, "skyrl_float64": None,
        "jaxrl": None, "skyrl": None, "differing": DIFFERING_DEFAULTS})
    return d


# The shared trainer.algorithm defaults that differ: key -> (jaxrl, SkyRL), each with its reason (docs/recipes.md).
DIFFERING_DEFAULTS = {
    "advantage_estimator": ("rloo_n", "grpo"),  # the seed runs' estimator
    "eps_clip_high": (0.05, 0.2),  # the seed runs' base arm
    "cispo.cispo_eps_clip_low": (1.0, 0.0),  # clamp [0, 5], the ScaleRL recipe (SkyRL's config: [1, 6])
    "cispo.cispo_eps_clip_high": (4.0, 5.0),
    "kl_loss_coef": (0.0, 0.001),  # no reference model unless asked for
    "entropy_loss_coef": (0.0, 0.01),  # jaxrl: on iff non-zero; SkyRL: behind use_entropy_loss (False)
    "temperature": (1.0, None),  # SkyRL: None = the sampling temperature; jaxrl checks they match
}
