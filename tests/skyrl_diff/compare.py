"""Which outputs of a case are compared, on which entries, and the float32 tolerance.

A quantity agrees when jaxrl (float32) is within float32 rounding of SkyRL in float32, or, where SkyRL's float32
is the one off, of SkyRL in float64 (`agree`). Masked entries are compared where both sides define them: SkyRL's
estimators leave values off the response mask (GAE's whitened padding, reinforce++'s carry into the column before
the response) that no loss reads; those are listed differences (differences.py), not compared here.
"""
from __future__ import annotations

import numpy as np

RTOL = 1e-5  # relative to the quantity's largest |value| (float32 has 6e-8; a few dozen roundings accumulate)
ATOL = 1e-7

# Metrics only one side reports (listed in differences.py as `metrics_only_skyrl`): not compared.
SKYRL_ONLY_METRICS = {"is_ratio_std"}
CONSTANT_ZERO_CLIP_RATIO = {"sapo", "kl_cov"}  # SkyRL logs clip_ratio = 0.0 for these; jaxrl reports none
# SkyRL divides these token metrics by the tokens the earlier masks left; jaxrl by the mini-batch's loss tokens
# (so micro-batches sum): compared after converting SkyRL's to jaxrl's denominator (difference
# `token_metric_denominator`).
KEPT_DENOMINATOR_METRICS = {"tis_token_clip_high_ratio"}
def tolerance(reference, scale=0.0):
    """RTOL x the quantity's largest |value| (at least 1 for a scalar: a loss or metric sums many terms larger
    than itself; at least `scale` where the inputs bound the rounding, `condition_scale`) + ATOL."""
    ref = np.asarray(reference, np.float64)
    largest = float(np.max(np.abs(ref))) if ref.size and np.all(np.isfinite(ref)) else 0.0
    if ref.ndim == 0:
        largest = max(largest, 1.0)
    return RTOL * max(largest, scale) + ATOL


def condition_scale(case):
    """The size of a case's float32 rounding where it is larger than its output: MaxRL divides
    r_i - mean_G by mean_G + 1e-6, so both sides' rounding of r_i - mean_G (about eps·max|r|) is
    magnified by 1/mean_G even where A itself is small; the scale is max_G max_i |r_i| / mean_G.
    0 for every other case (the output's own size bounds its rounding)."""
    if case["opts"].get("estimator") != "maxrl":
        return 0.0
    x = case["x"]
    scores = np.asarray(x["token_rewards"], np.float64).sum(-1)
    index = np.asarray(x["index"])
    scale = 0.0
    for g in np.unique(index):
        r = scores[index == g]
        if len(r) >= 2 and r.mean() > 0:
            scale = max(scale, float(np.max(np.abs(r)) / (r.mean() + 1e-6)))
    return scale


def error(a, b, where=None):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return np.inf
    if where is not None:
        a, b = a[where], b[where]
    if a.size == 0:
        return 0.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return 0.0 if np.array_equal(a, b, equal_nan=True) else np.inf
    return float(np.max(np.abs(a - b)))


def agree(j, s32, s64, where=None, scale=0.0):
    """(ok, how, err): how is 'float32' or 'float64' (SkyRL's float32 off, jaxrl within rounding of its float64).
    `scale`: `condition_scale` of the case."""
    ref = np.asarray(s64, np.float64) if where is None else np.asarray(s64, np.float64)[where]
    tol = tolerance(ref, scale)
    e32 = error(j, s32, where)
    if e32 <= tol:
        return True, "float32", e32
    e64 = error(j, s64, where)
    if e64 <= tol and error(s32, s64, where) > e64:
        return True, "float64", e64
    return False, "none", e32


def compared_keys(case, jax_out, sky32):
    """[(key, where)] for one case: the outputs both sides define, with the entries compared."""
    x, o, op = case["x"], case["opts"], case["op"]
    keys = []
    if op == "adv":
        on = np.asarray(x.get("loss_mask", x["response_mask"])) > 0
        keys.append(("advantages", on))
        if o["estimator"] in ("reinforce++", "gae"):  # outcome estimators' returns: difference `outcome_returns`
            keys.append(("returns", np.asarray(x["response_mask"]) > 0))
    elif op == "reduce":
        keys.append(("scaled_advantages", np.asarray(x["loss_mask"]) > 0))
    elif op in ("loss", "opc"):
        if op == "loss":
            keys += [("loss", None), ("grad", None)]
        else:
            keys.append(("kept_mask", None))
            if "factor" in sky32:
                keys.append(("factor", np.asarray(sky32["kept_mask"]) > 0))
        for k in sky32:
            if not k.startswith("metric/"):
                continue
            name = k[len("metric/"):]
            if name in SKYRL_ONLY_METRICS:
                continue
            if name == "clip_ratio" and o.get("policy_loss_type") in CONSTANT_ZERO_CLIP_RATIO:
                continue
            if name == "is_ratio_min" and not np.all(np.asarray(x["loss_mask"]) > 0):
                continue  # SkyRL's min counts masked positions as 0: difference `is_ratio_min_masked`
            if op == "loss" and name == "clip_ratio" and "kept_mask" in sky32 and (
                    np.sum(sky32["kept_mask"]) < np.sum(np.asarray(x["loss_mask"]) > 0)):
                continue  # SkyRL counts tokens an off-policy mask dropped: difference `loss_metrics_skip_masked_tokens`
            opc = o.get("opc") or o.get("skyrl_cfg", {}).get("off_policy_correction") or {}
            if name.startswith("tis_") and opc.get("sequence_mask_metric"):
                continue  # SkyRL counts capped rows the sequence mask drops next: `tis_metrics_after_sequence_mask`
            keys.append((k, None))
    elif op == "kl":
        keys += [("kl", None), ("grad", None)]
    elif op == "kl_reward":
        keys += [("rewards", None), ("avg_kl", None), ("avg_kl_max", None)]
        if "next_kl_coef" in sky32:
            keys.append(("next_kl_coef", None))
    elif op == "kl_ctrl":
        keys.append(("values", None))
    elif op == "critic":
        keys += [("loss", None), ("grad", None)]
        if "values_clipfrac" in sky32:
            keys.append(("values_clipfrac", None))
    return keys


def skyrl_value(case, key, sky):
    """SkyRL's output for `key`, in jaxrl's convention where a listed convention differs (see above)."""
    value = sky[key]
    name = key[len("metric/"):] if key.startswith("metric/") else None
    if name in KEPT_DENOMINATOR_METRICS and "kept_mask" in sky:
        loss_tokens = max(float(np.sum(np.asarray(case["x"]["loss_mask"]) > 0)), 1.0)
        value = float(value) * max(float(np.sum(sky["kept_mask"])), 1.0) / loss_tokens
    return value
