"""The seeded inputs of the differential tier (numpy only: both sides read them from one pickle).

Every case is a dict: `id` (unique), `pair` (the compared pair of functions, one test item each), `op` (which
function family runs: adv, reduce, loss, opc, kl, kl_reward, kl_ctrl, critic), `opts` (options; for losses both
sides' configs, built from one spec by `loss_opts`) and `x` (the arrays, float64 numpy, cast by each side).

Layout: SkyRL's, response tensors right-aligned (leading padding), one trajectory per row, ragged lengths;
loss masks with holes and rows without a loss token; groups of 1, 2, 4, 8 shuffled through the batch; rewards
all-equal (non-zero), zero, binary and continuous; log-ratios log π − log π_old of 0 (the first update of a
step), 1e-3, 0.1, 1 and log-uniform 1e-3..25.
"""
from __future__ import annotations

import numpy as np

T = 12  # padded response width (a few shapes only: jaxrl runs eagerly, one compile per shape and primitive)
GROUP_LAYOUTS = {"mixed_1248": [1, 2, 4, 8], "pairs": [2, 2, 2, 2], "fours": [4, 4], "eights": [8, 8],
                 "singles": [1, 1, 1, 1]}
REWARD_KINDS = ("equal", "zero", "binary", "continuous")
LOG_RATIO_REGIMES = ("on_policy", "tiny", "small", "large", "huge")


def right_aligned(lengths, width=T):
    """float [N, width]: 1 on the last `lengths[i]` columns of row i."""
    cols = np.arange(width)[None, :]
    return (cols >= width - np.asarray(lengths)[:, None]).astype(np.float64)


def group_index(rng, sizes):
    """Shuffled prompt ids for groups of the given sizes (members not contiguous)."""
    ids = np.concatenate([np.full(s, 100 + g) for g, s in enumerate(sizes)])
    return rng.permutation(ids).astype(np.int64)


def outcome_rewards(rng, index, kind):
    n = len(index)
    if kind == "equal":  # every group equal, not zero: the float32 residue case
        values = {g: rng.choice([0.1, 0.3, 0.7, 1.0, -0.2]) for g in np.unique(index)}
        return np.array([values[g] for g in index])
    if kind == "zero":
        return np.zeros(n)
    if kind == "binary":
        return rng.integers(0, 2, n).astype(np.float64)
    return rng.normal(0.0, 1.0, n)


def token_rewards(rng, response_mask, scores, per_token=False):
    """The outcome score on each row's last response token (SkyRL), optionally plus per-token rewards."""
    r = np.zeros(response_mask.shape)
    r[:, -1] = scores  # right-aligned: the last column is every non-empty row's last token
    if per_token:
        r = r + rng.normal(0.0, 0.5, r.shape) * response_mask
    return r * response_mask


def log_ratio(rng, shape, regime):
    if regime == "on_policy":
        return np.zeros(shape)
    if regime == "huge":
        return rng.choice([-1.0, 1.0], shape) * np.exp(rng.uniform(np.log(1e-3), np.log(25.0), shape))
    scale = {"tiny": 1e-3, "small": 0.1, "large": 1.0}[regime]
    return rng.normal(0.0, scale, shape)


def loss_inputs(rng, n, regime, holes=True, per_token_adv=False, mu_scale=None, lengths=None):
    """Arrays of a policy-loss case: ragged right-aligned masks with holes; finite garbage where masked."""
    lengths = rng.integers(1, T + 1, n) if lengths is None else np.asarray(lengths)
    response = right_aligned(lengths)
    mask = response * (rng.random((n, T)) > 0.25) if holes else response
    if n >= 4 and holes:
        mask[rng.integers(0, n)] = 0.0  # a row without a loss token
    old = -rng.uniform(0.01, 8.0, (n, T))
    lp = old + log_ratio(rng, (n, T), regime)
    if per_token_adv:
        adv = rng.normal(0.0, 1.0, (n, T))
    else:
        adv = np.repeat(rng.normal(0.0, 1.0, (n, 1)), T, axis=1)
    adv[rng.random((n, T)) < 0.1] = 0.0  # exact zeros (the A <= 0 / A > 0 branches)
    x = {"logprobs": lp, "old_logprobs": old, "advantages": adv * response, "loss_mask": mask}
    if mu_scale is not None:
        x["rollout_logprobs"] = old - rng.normal(0.0, mu_scale, (n, T))
    return x


# ------------------------------------------------------------------------------------------ configs
def loss_opts(policy_loss_type, loss_reduction="token_mean", max_seq_len=None, eps=(0.2, 0.2), clip_ratio_c=3.0,
              cispo=(1.0, 4.0), sapo=(1.0, 1.05), clip_cov=(2e-4, 1.0, 5.0), kl_cov=(0.2, 1.0), opc=None,
              selection_from="old"):
    """Both sides' configs of one loss case, every value set explicitly (defaults are their own pair).

    loss_reduction "sum" is the loss functions' plain masked sum (SkyRL: unscaled advantages; jaxrl: a
    registered reduction with weights = the loss mask), used where SkyRL's prescaling meets a covariance.
    """
    opc = dict(opc or {})
    jaxrl = dict(policy_loss_type=policy_loss_type, loss_reduction=loss_reduction, max_seq_len=max_seq_len,
                 eps_clip_low=eps[0], eps_clip_high=eps[1], clip_ratio_c=clip_ratio_c, cispo_eps_clip_low=cispo[0],
                 cispo_eps_clip_high=cispo[1], sapo_tau_pos=sapo[0], sapo_tau_neg=sapo[1],
                 clip_cov_ratio=clip_cov[0], clip_cov_lb=clip_cov[1], clip_cov_ub=clip_cov[2],
                 kl_cov_frac=kl_cov[0], ppo_kl_coef=kl_cov[1], kl_loss_coef=0.0, **opc)
    skyrl = dict(policy_loss_type=policy_loss_type, loss_reduction=loss_reduction, max_seq_len=max_seq_len,
                 eps_clip_low=eps[0], eps_clip_high=eps[1], clip_ratio_c=clip_ratio_c,
                 cispo={"cispo_eps_clip_low": cispo[0], "cispo_eps_clip_high": cispo[1]},
                 sapo={"tau_pos": sapo[0], "tau_neg": sapo[1]},
                 clip_cov={"clip_ratio": clip_cov[0], "clip_cov_lb": clip_cov[1], "clip_cov_ub": clip_cov[2]},
                 kl_cov={"kl_cov_frac": kl_cov[0], "ppo_kl_coef": kl_cov[1]}, off_policy_correction=opc)
    return {"policy_loss_type": policy_loss_type, "loss_reduction": loss_reduction, "max_seq_len": max_seq_len,
            "jaxrl_cfg": jaxrl, "skyrl_cfg": skyrl, "selection_from": selection_from}


OPC_VARIANTS = {
    "tis_token": {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0},
    "tis_token_cap1.5": {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.5},
    "tis_sequence": {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 5.0},
    "outlier": {"outlier_token_is_threshold_low": 0.5, "outlier_token_is_threshold_high": 2.0},
    "outlier_high_only": {"outlier_token_is_threshold_high": 1.5},
    "icepop": {"token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 2.0},
    "geometric": {"sequence_mask_metric": "geometric", "geo_mask_low": 0.9, "geo_mask_high": 1.1},
    "product": {"sequence_mask_metric": "product", "product_mask_low": 0.5, "product_mask_high": 2.0},
    "tis_token+outlier": {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0,
                          "outlier_token_is_threshold_low": 1e-2, "outlier_token_is_threshold_high": 10.0},
    "tis_sequence+geometric": {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 3.0,
                               "sequence_mask_metric": "geometric", "geo_mask_low": 0.8, "geo_mask_high": 1.25},
    "tis_token+icepop": {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0,
                         "token_mask_is_threshold_low": 0.25, "token_mask_is_threshold_high": 4.0},
}
MU_SCALES = (1e-3, 0.05, 0.5, 2.0)


# ------------------------------------------------------------------------------------------ the cases
def build_cases():
    cases = []

    def add(pair, op, opts, x, **extra):
        cases.append({"id": f"{pair}#{sum(c['pair'] == pair for c in cases)}", "pair": pair, "op": op,
                      "opts": opts, "x": x, **extra})

    rng = np.random.default_rng(27)
    # --- outcome advantage estimators: every group layout x reward kind, 2 seeds
    outcome = [("grpo", {"estimator": "grpo", "grpo_norm_by_std": True}),
               ("grpo_no_std", {"estimator": "grpo", "grpo_norm_by_std": False}),
               ("rloo", {"estimator": "rloo"}),
               ("rloo_n", {"estimator": "rloo", "jaxrl_estimator": "rloo_n", "group_advantage_min_size": 2}),
               ("maxrl", {"estimator": "maxrl"})]
    for name, opts in outcome:
        for layout, sizes in GROUP_LAYOUTS.items():
            for kind in REWARD_KINDS:
                for _ in range(2):
                    index = group_index(rng, sizes)
                    scores = outcome_rewards(rng, index, kind)
                    if name == "maxrl":
                        scores = np.abs(scores)  # MaxRL takes success rates (>= 0)
                    response = right_aligned(rng.integers(1, T + 1, len(index)))
                    add(f"adv/{name}", "adv", dict(opts, layout=layout, rewards=kind),
                        {"token_rewards": token_rewards(rng, response, scores), "response_mask": response,
                         "index": index})
    # --- reinforce++ (several gamma) and gae (gamma x lambda grid), outcome and per-token rewards
    for gamma in (1.0, 0.99, 0.9, 0.5, 0.0):
        for per_token in (False, True):
            for _ in range(2):
                n = int(rng.choice([4, 8, 15]))
                response = right_aligned(rng.integers(1, T + 1, n))
                index = np.arange(n)
                add("adv/reinforce++", "adv", {"estimator": "reinforce++", "gamma": gamma},
                    {"token_rewards": token_rewards(rng, response, rng.normal(0, 1, n), per_token),
                     "response_mask": response, "index": index})
    for gamma in (1.0, 0.99, 0.9):
        for lambd in (1.0, 0.95, 0.5, 0.0):
            for per_token in (False, True):
                n = int(rng.choice([4, 8]))
                response = right_aligned(rng.integers(1, T + 1, n))
                add("adv/gae", "adv", {"estimator": "gae", "gamma": gamma, "lambd": lambd},
                    {"token_rewards": token_rewards(rng, response, rng.normal(0, 1, n), per_token),
                     "response_mask": response, "index": np.arange(n),
                     "values": rng.normal(0, 1, (n, T))})
    # --- loss reductions (the per-token weights / scaled advantages)
    for reduction, max_seq_len in (("token_mean", None), ("sequence_mean", None), ("seq_mean_token_sum_norm", 32)):
        for n in (1, 4, 8):
            for holes in (False, True):
                x = loss_inputs(rng, n, "small", holes=holes, per_token_adv=True)
                add(f"reduce/{reduction}", "reduce", {"loss_reduction": reduction, "max_seq_len": max_seq_len},
                    {"advantages": x["advantages"], "loss_mask": x["loss_mask"]})
    # --- policy losses x reductions x log-ratio regimes
    reductions = (("token_mean", None), ("sequence_mean", None), ("seq_mean_token_sum_norm", 32))
    variants = {
        "regular": [dict(eps=(0.2, 0.2)), dict(eps=(0.2, 0.28)), dict(eps=(0.2, 0.05))],
        "dual_clip": [dict(clip_ratio_c=3.0), dict(clip_ratio_c=10.0, eps=(0.2, 0.28))],
        "gspo": [dict(eps=(3e-4, 4e-4)), dict(eps=(0.2, 0.2))],
        "cispo": [dict(cispo=(1.0, 4.0)), dict(cispo=(0.0, 5.0)), dict(cispo=(0.2, 0.2))],
        "sapo": [dict(sapo=(1.0, 1.05)), dict(sapo=(0.5, 2.0))],
    }
    for loss, opts_list in variants.items():
        for opts in opts_list:
            for reduction, msl in reductions:
                for regime in LOG_RATIO_REGIMES:
                    n = int(rng.choice([1, 4, 8]))
                    x = loss_inputs(rng, n, regime, per_token_adv=bool(rng.integers(0, 2)))
                    add(f"loss/{loss}", "loss", loss_opts(loss, reduction, msl, **opts), x)
    # clip_cov: on-policy (SkyRL selects with the current log π and skips PPO-clipped tokens: none at π = π_old),
    # every candidate cut (clip ratio 1: SkyRL's random draw then takes all), plain masked sum (SkyRL's
    # covariance bounds see the pre-scaled advantages: a listed difference); bounds chosen to catch some tokens.
    for bounds in ((0.2, 3.0), (-1.0, 0.5), (1.0, 5.0)):
        for _ in range(4):
            n = int(rng.choice([4, 8]))
            x = loss_inputs(rng, n, "on_policy", per_token_adv=True)
            x["advantages"] = x["advantages"] * 2.0
            add("loss/clip_cov", "loss", loss_opts("clip_cov", "sum", clip_cov=(1.0, *bounds)), x)
    # kl_cov: the selection of both is made from log π (jaxrl: from the log-probs it is given as π_old), plain sum
    # (SkyRL's penalty is not scaled by the reduction: a listed difference); off the kink (log π != log π_old).
    for frac, coef in ((0.2, 1.0), (0.5, 0.1), (1.0, 2.0)):
        for regime in ("tiny", "small", "large"):
            n = int(rng.choice([4, 8]))
            x = loss_inputs(rng, n, regime, per_token_adv=True)
            add("loss/kl_cov", "loss", loss_opts("kl_cov", "sum", kl_cov=(frac, coef), selection_from="logprobs"), x)
    # kl_cov at log π = log π_old (every first update): the |Δ| kink, gradient 0 there on both sides.
    for frac, coef in ((0.2, 1.0), (0.5, 0.1)):
        for _ in range(3):
            x = loss_inputs(rng, 8, "on_policy", per_token_adv=True)
            add("loss/kl_cov_on_policy", "loss", loss_opts("kl_cov", "sum", kl_cov=(frac, coef)), x)
        x = loss_inputs(rng, 8, "on_policy", per_token_adv=True)
        add("loss/kl_cov_on_policy", "loss", loss_opts("kl_cov", "token_mean", kl_cov=(frac, coef)), x)
    # issue 25's input: SkyRL's gradient is [-1/3, 1/3, -1/6] (the penalty's derivative 0 at its minimum)
    add("loss/kl_cov_on_policy", "loss", loss_opts("kl_cov", "token_mean", kl_cov=(0.34, 1.0)),
        {"logprobs": np.array([[-1.0, -2.0, -4.0]]), "old_logprobs": np.array([[-1.0, -2.0, -4.0]]),
         "advantages": np.array([[1.0, -1.0, 0.5]]), "loss_mask": np.ones((1, 3))})
    # --- off-policy correction alone (factor, kept tokens, metrics) and inside each loss that applies it
    for name, opc in OPC_VARIANTS.items():
        for scale in MU_SCALES:
            for _ in range(2):
                n = int(rng.choice([4, 8]))
                x = loss_inputs(rng, n, "small", mu_scale=scale)
                add(f"opc/{name}", "opc", {"opc": opc, "jaxrl_cfg": loss_opts("regular", opc=opc)["jaxrl_cfg"]},
                    {"old_logprobs": x["old_logprobs"], "rollout_logprobs": x["rollout_logprobs"],
                     "loss_mask": x["loss_mask"]})
    # a capped token that the token mask drops; capped tokens of a row the outlier mask drops (issue 25's inputs)
    add("opc/tis_token+icepop", "opc", {"opc": OPC_VARIANTS["tis_token+icepop"] | {"token_mask_is_threshold_low": 0.5,
                                                                                    "token_mask_is_threshold_high": 2.0},
                                        "jaxrl_cfg": loss_opts("regular", opc=OPC_VARIANTS["tis_token+icepop"]
                                                               | {"token_mask_is_threshold_low": 0.5,
                                                                  "token_mask_is_threshold_high": 2.0})["jaxrl_cfg"]},
        {"old_logprobs": np.array([[-1.0, -1.0]]), "rollout_logprobs": np.array([[-2.0, -1.0]]),
         "loss_mask": np.ones((1, 2))})
    outlier = {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0, "outlier_token_is_threshold_high": 10.0}
    add("opc/tis_token+outlier", "opc", {"opc": outlier, "jaxrl_cfg": loss_opts("regular", opc=outlier)["jaxrl_cfg"]},
        {"old_logprobs": np.log([[20.0, 3.0], [3.0, 1.0]]), "rollout_logprobs": np.zeros((2, 2)),
         "loss_mask": np.ones((2, 2))})
    # sequence TIS / geometric / product masks with single tokens beyond |log ρ| = 20 (both sum the unclamped
    # log ρ and clamp the sum)
    for name in ("tis_sequence", "geometric", "product", "tis_sequence+geometric"):
        for _ in range(3):
            n = 4
            x = loss_inputs(rng, n, "small", mu_scale=0.05)
            x["rollout_logprobs"][:, -1] = x["old_logprobs"][:, -1] - rng.choice([-1.0, 1.0], n) * rng.uniform(20, 26, n)
            x["rollout_logprobs"][:, -2] = x["old_logprobs"][:, -2] + rng.uniform(19, 25, n)
            opc = OPC_VARIANTS[name]
            add(f"opc/{name}", "opc", {"opc": opc, "jaxrl_cfg": loss_opts("regular", opc=opc)["jaxrl_cfg"]},
                {"old_logprobs": x["old_logprobs"], "rollout_logprobs": x["rollout_logprobs"],
                 "loss_mask": x["loss_mask"]})
    add("opc/tis_sequence", "opc", {"opc": OPC_VARIANTS["tis_sequence"],
                                    "jaxrl_cfg": loss_opts("regular", opc=OPC_VARIANTS["tis_sequence"])["jaxrl_cfg"]},
        {"old_logprobs": np.array([[0.0, -24.0]]), "rollout_logprobs": np.array([[-25.0, 0.0]]),
         "loss_mask": np.ones((1, 2))})
    for loss, opts in (("regular", {}), ("dual_clip", {}), ("gspo", {}), ("cispo", {}), ("sapo", {})):
        for name, opc in OPC_VARIANTS.items():
            for reduction, msl in reductions[:2]:
                n = int(rng.choice([4, 8]))
                x = loss_inputs(rng, n, str(rng.choice(["small", "large"])), mu_scale=float(rng.choice(MU_SCALES)))
                add(f"loss/{loss}+opc", "loss", loss_opts(loss, reduction, msl, opc=opc, **opts), x)
    # --- KL estimators (values and vector-Jacobian products), KL in the reward with both controllers
    for est in ("k1", "k2", "k3", "abs"):
        for regime in ("on_policy", "tiny", "small", "large", "huge"):  # on_policy: π = π_ref, abs's kink
            for _ in range(2):
                n = int(rng.choice([4, 8]))
                x = loss_inputs(rng, n, regime)
                add(f"kl/{est}", "kl", {"estimator": est},
                    {"logprobs": x["logprobs"], "ref_logprobs": x["old_logprobs"], "loss_mask": x["loss_mask"],
                     "cotangent": rng.normal(0, 1, (n, T))})
    for est in ("k1", "k2", "k3", "abs"):
        for ctrl in (None, {"type": "fixed"}, {"type": "adaptive", "kl_target": 0.1, "horizon": 10000},
                     {"type": "adaptive", "kl_target": 0.5, "horizon": 500}):
            n = int(rng.choice([4, 8]))
            x = loss_inputs(rng, n, str(rng.choice(["small", "large"])))
            response = right_aligned(np.full(n, T))
            add("kl_reward", "kl_reward", {"estimator": est, "kl_coef": float(rng.choice([0.001, 0.05, 0.5, -0.1])),
                                           "use_controller": ctrl is not None, "kl_ctrl": ctrl or {}},
                {"token_rewards": token_rewards(rng, x["loss_mask"], rng.normal(0, 1, n), True),
                 "old_logprobs": x["logprobs"], "ref_logprobs": x["old_logprobs"], "loss_mask": x["loss_mask"]})
    for kind in ("fixed", "adaptive"):
        for target, horizon in ((0.1, 10000), (0.02, 100), (1.0, 50)):
            updates = [(float(rng.choice([0.0, 1e-3, 0.05, 0.1, 0.5, 3.0])), int(rng.choice([8, 64, 512])))
                       for _ in range(6)]
            add(f"kl_ctrl/{kind}", "kl_ctrl", {"type": kind, "init": float(rng.choice([0.001, 0.1, 1.0])),
                                               "target": target, "horizon": horizon, "updates": updates}, {})
    # --- the critic loss (clipped, unclipped) on ragged masks with holes
    for clip in (0.2, 0.5, None):
        for regime in ("on_policy", "small", "large"):
            for _ in range(2):
                n = int(rng.choice([1, 4, 8]))
                x = loss_inputs(rng, n, "small")
                old_v = rng.normal(0, 1, (n, T))
                values = old_v + log_ratio(rng, (n, T), regime)
                add("critic", "critic", {"value_clip": clip},
                    {"values": values, "old_values": old_v, "returns": rng.normal(0, 1, (n, T)),
                     "loss_mask": x["loss_mask"]})
    return cases
