"""Policy losses, reductions, KL, entropy and off-policy correction against float64 numpy
references written here (never the code under test), plus gradient and micro-batch checks."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl import rl
from jaxrl.rl import registry

REDUCTIONS = ["token_mean", "sequence_mean", "seq_mean_token_sum_norm"]
LOSSES = ["regular", "dual_clip", "gspo", "cispo", "sapo", "clip_cov", "kl_cov"]
MAX_SEQ_LEN = 64


def cfg(**kw):
    kw.setdefault("max_seq_len", MAX_SEQ_LEN)
    # The references below clip at 1 + 0.2 unless a test says otherwise (SkyRL's symmetric clip);
    # LossConfig's own default is the config key's, 0.05 (jaxrl/config/algorithm.py).
    kw.setdefault("eps_clip_high", 0.2)
    return rl.LossConfig(**kw)


# ------------------------------ float64 numpy reference ------------------------------

def np_weights(mask, reduction, max_seq_len=MAX_SEQ_LEN):
    m = np.asarray(mask, np.float64)
    b = m.shape[0]
    if reduction == "token_mean":
        return m / max(m.sum(), 1.0)
    if reduction == "sequence_mean":
        return m / (b * np.maximum(m.sum(1, keepdims=True), 1.0))
    if reduction == "seq_mean_token_sum_norm":
        return m / (b * max_seq_len)
    raise AssertionError(reduction)


def np_ppo(r, a, el, eh):
    return np.maximum(-a * r, -a * np.clip(r, 1 - el, 1 + eh))


def np_token_loss(name, lp, old, a, m, el=0.2, eh=0.2, c=3.0, selected=None, tau=(1.0, 1.05), kl_coef=1.0):
    lp, old, a = (np.asarray(x, np.float64) for x in (lp, old, a))
    m = np.asarray(m, bool)
    if name == "sapo":
        r = np.exp(np.clip(lp - old, -20, 20))
        t = np.where(a > 0, tau[0], tau[1])
        return -a * 4.0 / t / (1.0 + np.exp(-t * (r - 1.0)))
    if name == "clip_cov":
        r = np.exp(np.clip(lp - old, -20, 20))
        return np_ppo(r, a, el, eh) * (1.0 - np_selection(name, old, a, m) if selected is None else 1.0 - selected)
    if name == "kl_cov":
        r = np.exp(np.clip(lp - old, -20, 20))
        s = np_selection(name, old, a, m) if selected is None else selected
        return -a * r + s * kl_coef * np.abs(lp - old)
    if name in ("regular", "dual_clip"):
        r = np.exp(np.clip(lp - old, -20, 20))
        loss = np_ppo(r, a, el, eh)
        if name == "dual_clip":
            loss = np.where(a < 0, np.minimum(loss, -c * a), loss)
        return loss
    if name == "gspo":
        s = np.exp(np.minimum(((lp - old) * m).sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1), 10))
        return np_ppo(np.broadcast_to(s, lp.shape), a, el, eh)
    if name == "cispo":
        r = np.exp(np.clip(lp - old, -20, 20))
        return -a * np.clip(r, 0.0, 5.0) * lp
    raise AssertionError(name)


def np_cov(old, a, m):
    """(A − mean A)(logπ_old − mean logπ_old) over the loss tokens, float64."""
    m = np.asarray(m, bool)
    old, a = np.asarray(old, np.float64), np.asarray(a, np.float64)
    return np.where(m, (a - a[m].mean()) * (old - old[m].mean()), 0.0)


def np_selection(name, old, a, m, frac=0.2):
    """kl_cov's top-⌊frac·n⌋ covariance tokens (ties by row-major position); clip_cov has a random
    draw, so its reference takes the selection as given."""
    assert name == "kl_cov", "clip_cov's selection is random: pass it"
    m = np.asarray(m, bool)
    cov = np_cov(old, a, m)
    k = max(int(frac * m.sum()), 1)
    flat = [(-cov.ravel()[i], i) for i in np.flatnonzero(m.ravel())]
    chosen = [i for _, i in sorted(flat)[:k]]
    out = np.zeros(m.size)
    out[chosen] = 1.0
    return out.reshape(m.shape)


def np_kl(lp, ref, kind):
    d = np.asarray(lp, np.float64) - np.asarray(ref, np.float64)
    if kind == "k1":
        return d
    if kind == "abs":
        return np.abs(d)
    if kind == "k2":
        return 0.5 * d * d
    x = np.clip(-d, -20, 20)
    return np.clip(np.exp(x) - x - 1, -10, 10)


def make_batch(seed, n=8, t=16, spread=0.3):
    """Rows with very different response lengths (1 … t), one all-masked row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=n)
    lengths[0], lengths[1] = 1, t
    lengths[-1] = 0
    mask = np.zeros((n, t), np.float32)
    for i, l in enumerate(lengths):
        start = rng.integers(0, t - l + 1)
        mask[i, start:start + l] = 1
    old = -rng.uniform(0.05, 3.0, size=(n, t)).astype(np.float32)
    lp = (old + spread * rng.normal(size=(n, t))).astype(np.float32)
    adv_seq = rng.normal(size=n).astype(np.float32)
    adv = (adv_seq[:, None] * mask).astype(np.float32)
    mu = (old + 0.2 * rng.normal(size=(n, t))).astype(np.float32)
    ref = (old + 0.3 * rng.normal(size=(n, t))).astype(np.float32)
    ent = rng.uniform(0, 3, size=(n, t)).astype(np.float32)
    return dict(logprobs=lp, old_logprobs=old, advantages=adv, loss_mask=mask,
                rollout_logprobs=mu, ref_logprobs=ref, entropy=ent)


def weights_of(batch, config, seed=0):
    """compute_loss_weights of a whole mini-batch (with what the covariance losses need)."""
    return rl.compute_loss_weights(batch["loss_mask"], config, old_logprobs=batch["old_logprobs"],
                                   advantages=batch["advantages"], rng=jax.random.key(seed))


def loss_and_grad(batch, config, weights=None, **extra):
    """Loss, metrics and d loss / d logprobs for one (micro-)batch given mini-batch weights."""
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    w = weights_of(b, config) if weights is None else weights
    return _loss_and_grad(b, w, config, **extra)


def _loss_and_grad(b, w, config, **extra):
    def f(lp):
        return rl.micro_batch_loss(lp, b["old_logprobs"], b["advantages"], b["loss_mask"], w, config,
                                   rollout_logprobs=b.get("rollout_logprobs"), ref_logprobs=b.get("ref_logprobs"),
                                   entropy=b.get("entropy"), **extra)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(b["logprobs"])
    return loss, metrics, grad


def only(batch, *keys):
    return {k: batch[k] for k in ("logprobs", "old_logprobs", "advantages", "loss_mask") + keys}


# ------------------------------ loss values ------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", LOSSES)
def test_policy_loss_values_match_reference(name, reduction):
    batch = make_batch(0)
    config = cfg(policy_loss_type=name, loss_reduction=reduction, eps_clip_low=0.2, eps_clip_high=0.05)
    loss, metrics, grad = loss_and_grad(only(batch), config)
    m = batch["loss_mask"]
    w = np_weights(m, reduction)
    selected = None
    if name == "clip_cov":  # a random draw: take it from the weights, check it separately
        selected = np.asarray(weights_of({k: jnp.asarray(v) for k, v in batch.items()}, config).selected)
    per_tok = np_token_loss(name, batch["logprobs"], batch["old_logprobs"], batch["advantages"], m, 0.2, 0.05,
                            selected=selected)
    expected = float(np.sum(w * np.where(m > 0, per_tok, 0.0)))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["policy_loss"]), expected, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(grad)[m == 0] == 0)


def test_reduction_weights_and_alias():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    # hand values: 4 tokens; 3 sequences (the empty row counts, as in SkyRL); max_seq_len 64
    w = rl.compute_loss_weights(mask, cfg(loss_reduction="token_mean")).policy
    np.testing.assert_allclose(np.asarray(w), mask / 4)
    w = rl.compute_loss_weights(mask, cfg(loss_reduction="sequence_mean")).policy
    np.testing.assert_allclose(np.asarray(w), [[1 / 9, 1 / 9, 1 / 9, 0], [1 / 3, 0, 0, 0], [0, 0, 0, 0]], rtol=1e-6)
    alias = cfg(loss_reduction="seq_mean_token_sum_norm_global", max_seq_len=8)
    assert alias.loss_reduction == "seq_mean_token_sum_norm"
    np.testing.assert_allclose(np.asarray(rl.compute_loss_weights(mask, alias).policy), mask / 24)
    # padding rows (sequence_mask False) do not count as sequences
    w = rl.compute_loss_weights(mask, cfg(loss_reduction="sequence_mean"), sequence_mask=np.array([1, 1, 0], bool))
    np.testing.assert_allclose(np.asarray(w.policy)[1, 0], 1 / 2)
    np.testing.assert_allclose(np.asarray(w.sequence), [0.5, 0.5, 0.0])


def test_max_seq_len_is_required():
    with pytest.raises(ValueError, match="max_seq_len"):
        rl.LossConfig(loss_reduction="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="max_seq_len"):
        rl.LossConfig(loss_reduction="seq_mean_token_sum_norm_global")
    with pytest.raises(ValueError, match="max_seq_len"):
        rl.LossConfig(loss_reduction="seq_mean_token_sum_norm", max_seq_len=0)


def test_asymmetric_clip():
    # Ratios 1.1 and 0.9 sit 0.1 from 1. With eps_low=0.2, eps_high=0.05 the ratio 1.1 is clipped
    # for A > 0 (1.1 > 1.05) while 0.9 with A < 0 is not (0.9 > 0.8); 0.75 with A < 0 is clipped low.
    r = np.array([[1.1, 0.9, 1.1, 0.9, 0.75, 1.3]])
    a = np.array([[1.0, -1.0, -1.0, 1.0, -1.0, 1.0]], np.float32)
    old = np.full_like(r, -1.0, dtype=np.float32)
    lp = (old + np.log(r)).astype(np.float32)
    batch = dict(logprobs=lp, old_logprobs=old, advantages=a, loss_mask=np.ones_like(a))
    # hand values of max(−rA, −clip(r)A) with clip range [0.8, 1.05]
    hand = np.array([-1.05, 0.9, 1.1, -0.9, 0.8, -1.05])
    hand_grad = np.array([0.0, 0.9, 1.1, -0.9, 0.0, 0.0]) / 6  # −A·r on unclipped tokens, token mean
    loss, metrics, grad = loss_and_grad(batch, cfg(eps_clip_low=0.2, eps_clip_high=0.05))
    np.testing.assert_allclose(float(loss), hand.mean(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad)[0], hand_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["clip_ratio"]), 3 / 6, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["clip_ratio_high"]), 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["clip_ratio_low"]), 1 / 6, rtol=1e-6)
    # approx_kl: token mean of k3 between π_θ and π_old, x = log(π_old/π_θ) = −log r
    np.testing.assert_allclose(float(metrics["approx_kl"]), np.mean(1 / r - np.log(1 / r) - 1), rtol=1e-4)
    # symmetric 0.2/0.2: 1.1 is no longer clipped; only 0.75 (low) and 1.3 (high) are
    hand_sym = np.array([-1.1, 0.9, 1.1, -0.9, 0.8, -1.2])
    loss, metrics, grad = loss_and_grad(batch, cfg(eps_clip_low=0.2, eps_clip_high=0.2))
    np.testing.assert_allclose(float(loss), hand_sym.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["clip_ratio"]), 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["clip_ratio_high"]), 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_max"]), 1.3, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ratio_min"]), 0.75, rtol=1e-5)


def test_dual_clip_caps_negative_advantage():
    # r = 5, A = −1: regular loss max(5, 1.2) = 5; dual clip with c = 3 caps it at 3 (no gradient).
    lp = np.log(np.array([[5.0, 5.0]], np.float32))
    batch = dict(logprobs=lp, old_logprobs=np.zeros_like(lp), advantages=np.array([[-1.0, 1.0]], np.float32),
                 loss_mask=np.ones((1, 2), np.float32))
    loss, metrics, grad = loss_and_grad(batch, cfg(policy_loss_type="dual_clip", clip_ratio_c=3.0))
    np.testing.assert_allclose(float(loss), (3.0 + -1.2) / 2, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(grad), [[0.0, 0.0]])
    np.testing.assert_allclose(float(metrics["dual_clip_ratio"]), 0.5)


# ------------------------------ gradients ------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_on_policy_gradient_is_reinforce(reduction):
    """ratio = 1: ∇ of the regular loss = −A·w (REINFORCE weighted by the reduction)."""
    batch = make_batch(1)
    batch["logprobs"] = batch["old_logprobs"].copy()
    for name in ("regular", "dual_clip", "gspo", "sapo"):
        config = cfg(policy_loss_type=name, loss_reduction=reduction, eps_clip_low=0.2, eps_clip_high=0.05)
        _, _, grad = loss_and_grad(only(batch), config)
        expected = -np.asarray(batch["advantages"], np.float64) * np_weights(batch["loss_mask"], reduction)
        np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_off_policy_gradients_closed_form(reduction):
    batch = make_batch(2)
    m = batch["loss_mask"]
    w = np_weights(m, reduction)
    lp, old, a = (np.asarray(batch[k], np.float64) for k in ("logprobs", "old_logprobs", "advantages"))
    r = np.exp(lp - old)
    # regular: −A·r where the unclipped branch is selected, 0 where clipped
    clipped = -a * np.clip(r, 0.8, 1.05) > -a * r
    _, _, grad = loss_and_grad(only(batch), cfg(loss_reduction=reduction, eps_clip_low=0.2, eps_clip_high=0.05))
    np.testing.assert_allclose(np.asarray(grad), np.where(clipped, 0, -a * r) * w, rtol=2e-5, atol=1e-9)
    # cispo: −A·clip(r, 0, 5) (the weight is detached)
    _, _, grad = loss_and_grad(only(batch), cfg(policy_loss_type="cispo", loss_reduction=reduction))
    np.testing.assert_allclose(np.asarray(grad), -a * np.clip(r, 0, 5) * w, rtol=2e-5, atol=1e-9)


# ------------------------------ masked NaN / inf ------------------------------

@pytest.mark.parametrize("name", LOSSES)
def test_masked_nan_inf_never_leak(name):
    batch = make_batch(3)
    m = batch["loss_mask"] > 0
    config = cfg(policy_loss_type=name, loss_reduction="sequence_mean", kl_loss_coef=0.1,
                 entropy_loss_coef=0.01, tis_ratio_type="token", sequence_mask_metric="geometric",
                 geo_mask_low=0.5, geo_mask_high=2.0, outlier_token_is_threshold_high=1e4)
    clean_loss, clean_metrics, clean_grad = loss_and_grad(batch, config)
    dirty = dict(batch)
    poison = np.where(np.arange(m.size).reshape(m.shape) % 3 == 0, np.nan,
                      np.where(np.arange(m.size).reshape(m.shape) % 3 == 1, np.inf, -np.inf)).astype(np.float32)
    for k in ("logprobs", "old_logprobs", "advantages", "rollout_logprobs", "ref_logprobs", "entropy"):
        dirty[k] = np.where(m, batch[k], poison).astype(np.float32)
    loss, metrics, grad = loss_and_grad(dirty, config)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
    assert float(loss) == float(clean_loss)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(clean_grad))
    assert np.all(np.asarray(grad)[~m] == 0)
    for k, v in metrics.items():
        assert float(v) == float(clean_metrics[k]), k


# ------------------------------ KL and entropy ------------------------------

@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_kl_estimators(kind):
    # includes |Δ| = 25 (k3 inner clamp at 20 and outer clamp at 10)
    lp = np.array([[-1.0, -2.0, -0.5, -30.0, -3.0]], np.float32)
    ref = np.array([[-1.5, -1.0, -0.25, -5.0, -3.2]], np.float32)
    mask = np.array([[1, 1, 1, 1, 0]], np.float32)
    got = rl.kl_penalty(lp, ref, mask, kind)
    np.testing.assert_allclose(np.asarray(got), np_kl(lp, ref, kind) * mask, rtol=1e-6, atol=1e-7)
    if kind == "k3":
        assert float(got[0, 3]) == 10.0  # exp(20) − 21 clamped to 10
    # as a loss term: sequence mean with kl_loss_coef, differentiable in logprobs
    batch = dict(logprobs=lp, old_logprobs=lp, advantages=np.zeros_like(lp), loss_mask=mask, ref_logprobs=ref)
    loss, metrics, grad = loss_and_grad(batch, cfg(kl_loss_coef=0.5, kl_estimator_type=kind))
    np.testing.assert_allclose(float(loss), 0.5 * np.sum(np_kl(lp, ref, kind) * mask) / 4, rtol=1e-6)
    d = lp.astype(np.float64) - ref
    dkl = {"k1": np.ones_like(d), "abs": np.sign(d), "k2": d,
           "k3": np.where(np.abs(d) > 20, 0.0, 1 - np.exp(-d))}[kind]
    dkl = np.where(np_kl(lp, ref, "k3") >= 10, 0.0, dkl) if kind == "k3" else dkl
    np.testing.assert_allclose(np.asarray(grad), 0.5 * dkl * mask / 4, rtol=1e-5, atol=1e-8)


def test_needs_reference_model():
    assert not rl.needs_reference_model(cfg())
    assert not rl.needs_reference_model(cfg(kl_loss_coef=0.0))
    assert rl.needs_reference_model(cfg(kl_loss_coef=1e-3))
    batch = make_batch(4)
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_and_grad(only(batch), cfg(kl_loss_coef=1e-3))


def test_entropy_metric_bonus_and_from_logits():
    batch = make_batch(5)
    m = batch["loss_mask"]
    ent_mean = np.sum(batch["entropy"] * m) / m.sum()
    base, metrics, _ = loss_and_grad(only(batch, "entropy"), cfg(loss_reduction="sequence_mean"))
    np.testing.assert_allclose(float(metrics["entropy"]), ent_mean, rtol=1e-6)
    bonus, _, _ = loss_and_grad(only(batch, "entropy"), cfg(loss_reduction="sequence_mean", entropy_loss_coef=0.01))
    np.testing.assert_allclose(float(bonus) - float(base), -0.01 * ent_mean, rtol=1e-4)
    with pytest.raises(ValueError, match="entropy"):
        loss_and_grad(only(batch), cfg(entropy_loss_coef=0.01))
    logits = np.random.default_rng(0).normal(size=(3, 7)) * 3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(rl.entropy_from_logits(logits.astype(np.float32))),
                               -(p * np.log(p)).sum(-1), rtol=1e-5)


# ------------------------------ off-policy correction ------------------------------

def test_token_and_sequence_tis():
    batch = make_batch(6)
    m = batch["loss_mask"]
    old, mu = (np.asarray(batch[k], np.float64) for k in ("old_logprobs", "rollout_logprobs"))
    rho = np.exp(old - mu)
    base = np_token_loss("regular", batch["logprobs"], old, batch["advantages"], m)
    w = np_weights(m, "token_mean")
    loss, metrics, _ = loss_and_grad(only(batch, "rollout_logprobs"), cfg(tis_ratio_type="token", token_tis_ratio_clip_high=1.1))
    np.testing.assert_allclose(float(loss), np.sum(w * base * np.minimum(rho, 1.1) * m), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["tis_token_clip_high_ratio"]), np.sum((rho > 1.1) * m) / m.sum(), rtol=1e-6)
    # the factor is detached: ∇_logπ = (PPO gradient)·min(ρ, cap), and μ gets no gradient
    lp, a = np.asarray(batch["logprobs"], np.float64), np.asarray(batch["advantages"], np.float64)
    r = np.exp(lp - old)
    ppo_grad = np.where(-a * np.clip(r, 0.8, 1.2) > -a * r, 0.0, -a * r)
    _, _, grad = loss_and_grad(only(batch, "rollout_logprobs"), cfg(tis_ratio_type="token", token_tis_ratio_clip_high=1.1))
    np.testing.assert_allclose(np.asarray(grad), ppo_grad * np.minimum(rho, 1.1) * w, rtol=2e-5, atol=1e-9)
    config = cfg(tis_ratio_type="token", token_tis_ratio_clip_high=1.1)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    weights = rl.compute_loss_weights(b["loss_mask"], config)
    g_mu = jax.grad(lambda mu: rl.micro_batch_loss(b["logprobs"], b["old_logprobs"], b["advantages"], b["loss_mask"],
                                                   weights, config, rollout_logprobs=mu)[0])(b["rollout_logprobs"])
    assert not np.any(np.asarray(g_mu))
    # ratio metrics over loss tokens only (masked positions do not count as 0)
    np.testing.assert_allclose(float(metrics["is_ratio_min"]), rho[m > 0].min(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["is_ratio_max"]), rho[m > 0].max(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["is_ratio_mean"]), rho[m > 0].mean(), rtol=1e-5)
    seq_rho = np.minimum(np.exp(((old - mu) * m).sum(1)), 1.5)
    loss, _, _ = loss_and_grad(only(batch, "rollout_logprobs"), cfg(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=1.5))
    np.testing.assert_allclose(float(loss), np.sum(w * base * seq_rho[:, None] * m), rtol=1e-5)
    # only untruncated rows are corrected: truncated rows keep factor 1
    trunc = np.array([True, False] * 4)
    loss, _, _ = loss_and_grad(only(batch, "rollout_logprobs"),
                               cfg(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=1.5, only_untruncated=True),
                               is_truncated=jnp.asarray(trunc))
    factor = np.where(trunc, 1.0, seq_rho)[:, None]
    np.testing.assert_allclose(float(loss), np.sum(w * base * factor * m), rtol=1e-5)
    with pytest.raises(ValueError, match="is_truncated"):
        loss_and_grad(only(batch, "rollout_logprobs"), cfg(tis_ratio_type="token", only_untruncated=True))
    with pytest.raises(ValueError, match="rollout_logprobs"):
        loss_and_grad(only(batch), cfg(tis_ratio_type="token"))


def test_outlier_and_geometric_sequence_masks():
    batch = make_batch(7)
    m = batch["loss_mask"]
    old, mu = (np.asarray(batch[k], np.float64) for k in ("old_logprobs", "rollout_logprobs"))
    logrho = (old - mu) * m
    rho = np.exp(old - mu)
    base = np_token_loss("regular", batch["logprobs"], old, batch["advantages"], m)
    w = np_weights(m, "token_mean")  # masks do not renormalise
    high = float(np.quantile(rho[m > 0], 0.9))
    drop = ((rho > high) & (m > 0)).any(1)
    assert 0 < drop.sum() < drop.size - 1
    loss, metrics, _ = loss_and_grad(only(batch, "rollout_logprobs"), cfg(outlier_token_is_threshold_high=high))
    np.testing.assert_allclose(float(loss), np.sum(w * base * m * ~drop[:, None]), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["outlier_seq_masked_ratio"]), drop.mean(), rtol=1e-6)
    geo = np.exp(logrho.sum(1) / np.maximum(m.sum(1), 1))
    lo, hi = np.quantile(geo, 0.25), np.quantile(geo, 0.75)
    keep = (geo >= lo) & (geo <= hi)
    loss, metrics, _ = loss_and_grad(only(batch, "rollout_logprobs"),
                                     cfg(sequence_mask_metric="geometric", geo_mask_low=float(lo) * 0.9999, geo_mask_high=float(hi) * 1.0001))
    np.testing.assert_allclose(float(loss), np.sum(w * base * m * keep[:, None]), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["geo_sequence_mask_masked_ratio"]), 1 - keep.mean(), rtol=1e-6)


# ------------------------------ micro-batch and sharding invariance ------------------------------

# Every option that touches the per-token weights at once: asymmetric clip, KL, entropy bonus,
# token TIS, outlier sequence mask and geometric sequence mask.
RICH = dict(eps_clip_low=0.2, eps_clip_high=0.05, kl_loss_coef=0.1, entropy_loss_coef=0.01,
            tis_ratio_type="token", outlier_token_is_threshold_high=1.5,
            sequence_mask_metric="geometric", geo_mask_low=0.8, geo_mask_high=1.25)


def check_invariance(batch, config, splits=(1, 2, 4), mesh_checks=True):
    weights = weights_of(batch, config)
    full_loss, full_metrics, full_grad = loss_and_grad(batch, config, weights)
    for k in splits:
        parts = rl.split_rows((batch, weights), k)
        outs = [loss_and_grad(b, config, w) for b, w in parts]
        loss = sum(o[0] for o in outs)
        grad = jnp.concatenate([o[2] for o in outs])
        metrics = functools.reduce(rl.combine_metrics, [o[1] for o in outs])
        np.testing.assert_allclose(float(loss), float(full_loss), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(grad), np.asarray(full_grad), rtol=1e-6, atol=1e-8)
        for key, v in full_metrics.items():
            np.testing.assert_allclose(float(metrics[key]), float(v), rtol=1e-5, atol=1e-7, err_msg=key)
    if not mesh_checks:
        return
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    # jit over a 4-device mesh with the batch sharded: XLA reduces across devices
    shard = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))
    sb, sw = jax.tree.map(shard, batch), jax.tree.map(shard, weights)
    assert len(sb["logprobs"].sharding.device_set) == 4
    loss, _, grad = jax.jit(lambda b, w: loss_and_grad(b, config, w))(sb, sw)
    np.testing.assert_allclose(float(loss), float(full_loss), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(full_grad), rtol=1e-6, atol=1e-8)

    # shard_map: each device computes its shard's sum, psum combines (explicit data parallel)
    def per_device(b, w):
        loss, _, grad = loss_and_grad(b, config, w)
        return jax.lax.psum(loss, "data"), grad

    spec = jax.tree.map(lambda _: P("data"), (batch, weights))
    fn = jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=(P(), P("data")))
    loss, grad = jax.jit(fn)(batch, weights)
    np.testing.assert_allclose(float(loss), float(full_loss), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(full_grad), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_micro_batch_and_sharding_invariance(reduction):
    batch = {k: jnp.asarray(v) for k, v in make_batch(8, n=16, t=12).items()}
    config = cfg(loss_reduction=reduction, **RICH)
    w = weights_of(batch, config)
    _, metrics, _ = loss_and_grad(batch, config, w)
    # the masks must actually drop rows for the check to cover them
    assert 0 < float(metrics["outlier_seq_masked_ratio"]) < 0.5
    check_invariance(batch, config)


@pytest.mark.parametrize("name", ["gspo", "cispo", "dual_clip"])
def test_micro_batch_invariance_other_losses(name):
    batch = {k: jnp.asarray(v) for k, v in make_batch(11, n=16, t=12).items()}
    extra = dict(tis_ratio_type="sequence") if name == "cispo" else dict(kl_loss_coef=0.05, kl_estimator_type="k2")
    check_invariance(batch, cfg(policy_loss_type=name, loss_reduction="sequence_mean", **extra),
                     splits=(4,), mesh_checks=False)


@pytest.mark.parametrize("name", ["sapo", "clip_cov", "kl_cov"])
def test_micro_batch_and_sharding_invariance_new_losses(name):
    """The token selection of clip_cov / kl_cov is made once per mini-batch, so neither micro-batching
    nor sharding changes it (SkyRL selects per micro-batch, which does)."""
    batch = {k: jnp.asarray(v) for k, v in make_batch(12, n=16, t=12, spread=1.0).items()}
    config = cfg(policy_loss_type=name, loss_reduction="token_mean", clip_cov_ratio=0.05, clip_cov_lb=-1.0,
                 clip_cov_ub=5.0, kl_cov_frac=0.1, **RICH)
    w = weights_of(batch, config)
    if name != "sapo":  # the selection covers several micro-batches' rows
        rows = np.flatnonzero(np.asarray(w.selected).sum(1))
        assert len(set(rows // 4)) >= 2, rows
    check_invariance(batch, config)


# ------------------------------ registry and config errors ------------------------------

def test_register_custom_policy_loss():
    name = "test_reinforce"

    @rl.register_policy_loss(name)
    def reinforce(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs):
        return -advantages * logprobs, {"neg_adv_max": -advantages}

    try:
        batch = make_batch(9)
        m = batch["loss_mask"]
        loss, metrics, grad = loss_and_grad(only(batch), cfg(policy_loss_type=name, loss_reduction="sequence_mean"))
        w = np_weights(m, "sequence_mean")
        np.testing.assert_allclose(float(loss), np.sum(-w * batch["advantages"] * batch["logprobs"]), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(grad), -w * batch["advantages"], rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(float(metrics["neg_adv_max"]), (-batch["advantages"])[m > 0].max(), rtol=1e-6)
    finally:
        registry.POLICY_LOSSES.pop(name)


def test_unknown_names_list_valid_ones():
    batch = make_batch(10)
    with pytest.raises(ValueError, match=r"Unknown policy loss 'ppo2'.*cispo, clip_cov, dual_clip, gspo, kl_cov, "
                                         r"regular, sapo"):
        loss_and_grad(only(batch), cfg(policy_loss_type="ppo2"))
    with pytest.raises(ValueError, match=r"Unknown loss reduction 'mean'.*sequence_mean.*token_mean"):
        rl.compute_loss_weights(batch["loss_mask"], cfg(loss_reduction="mean"))
    with pytest.raises(ValueError, match="kl_estimator_type"):
        cfg(kl_estimator_type="low_var_kl")
    with pytest.raises(ValueError, match="eps_clip_low"):
        cfg(eps_clip_low=1.0)
    with pytest.raises(ValueError, match="double-count"):
        cfg(policy_loss_type="cispo", cispo_anchor="rollout", tis_ratio_type="token")
    with pytest.raises(ValueError, match="advantages"):
        rl.minibatch_loss(batch["logprobs"], batch["old_logprobs"], batch["advantages"][:, :3], batch["loss_mask"], cfg())


# ------------------------------ non-finite values on loss tokens (issue 9 §3) ------------------------------

NAN_MU_ROW = [-1.0, np.nan, -1.0, -1.0]


def _issue_batch(rows_mu):
    """Rows of 4 loss tokens, logprob = old logprob = -1, advantage 1, the given rollout logprobs."""
    n = len(rows_mu)
    ones = np.ones((n, 4), np.float32)
    return dict(logprobs=-ones, old_logprobs=-ones, advantages=ones, loss_mask=ones,
                rollout_logprobs=np.asarray(rows_mu, np.float32))


@pytest.mark.parametrize("tis", [None, "token", "sequence"])
def test_nan_rollout_logprob_on_a_loss_token_drops_its_row(tis):
    """The issue's input (one row, μ = [-1, NaN, -1, -1]) and the same row next to a valid one."""
    config = cfg(tis_ratio_type=tis)
    loss, metrics, grad = loss_and_grad(_issue_batch([NAN_MU_ROW]), config)
    # By hand: the only row is invalid engine output -> no policy-gradient term, no ratio.
    assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
    assert float(metrics["invalid_rollout_seq_ratio"]) == 1.0
    if tis is None:  # metrics rule: no correction enabled -> no is_ratio_* (absent, not 0)
        assert not [k for k in metrics if k.startswith("is_ratio")]
    else:
        assert float(metrics["is_ratio_mean"]) == 1.0  # its tokens count as ρ = 1
        assert float(metrics["is_ratio_max"]) == -np.inf and float(metrics["is_ratio_min"]) == np.inf  # none valid
    assert all(np.isfinite(float(v)) for k, v in metrics.items() if not k.endswith(("_max", "_min")))

    # A valid row with log μ = -1.5 (ρ = e^0.5 on every token) next to the invalid one.
    loss, metrics, grad = loss_and_grad(_issue_batch([[-1.5] * 4, NAN_MU_ROW]), config)
    rho = np.exp(0.5)
    factor = {None: 1.0, "token": min(rho, 2.0), "sequence": min(rho ** 4, 5.0)}[tis]
    # token_mean over the 8 loss tokens; row 0: r = 1, A = 1 -> ℓ = -1 per token, times the TIS factor.
    np.testing.assert_allclose(float(loss), 4 * -factor / 8, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.r_[[[-factor / 8] * 4], [[0.0] * 4]], rtol=1e-6)
    if tis is not None:
        np.testing.assert_allclose(float(metrics["is_ratio_mean"]), (4 * rho + 4 * 1.0) / 8, rtol=1e-6)
        np.testing.assert_allclose([float(metrics["is_ratio_max"]), float(metrics["is_ratio_min"])], [rho, rho],
                                   rtol=1e-6)
    assert float(metrics["invalid_rollout_seq_ratio"]) == 0.5


@pytest.mark.parametrize("mu_bad", [np.inf, -np.inf])
def test_infinite_rollout_logprob_is_invalid_too(mu_bad):
    config = cfg(policy_loss_type="cispo", cispo_anchor="rollout")  # μ inside the loss itself
    loss, metrics, grad = loss_and_grad(_issue_batch([[-1.0, mu_bad, -1.0, -1.0], [-1.0] * 4]), config)
    # Row 1: r = π/μ = 1, clamp [0, 5] -> ℓ = -A·1·logπ = 1 per token; token mean over 8 tokens.
    np.testing.assert_allclose(float(loss), 4 * 1.0 / 8, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.r_[[[0.0] * 4], [[-1 / 8] * 4]], rtol=1e-6)
    assert float(metrics["invalid_rollout_seq_ratio"]) == 0.5


@pytest.mark.parametrize("key", ["logprobs", "old_logprobs", "advantages"])
def test_nan_on_a_loss_token_in_trainer_inputs_is_not_hidden(key):
    batch = _issue_batch([[-1.0] * 4])
    batch[key] = batch[key].copy()
    batch[key][0, 2] = np.nan
    loss, _, _ = loss_and_grad(batch, cfg(tis_ratio_type="token"))
    assert np.isnan(float(loss))


def test_entropy_from_logits_with_minus_inf_entries():
    """Logits with -inf (tokens removed from the vocabulary): 0·(-inf) must not become NaN."""
    logits = np.array([[2.0, -np.inf, 0.5, -1.0], [-np.inf, -np.inf, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    finite = np.where(np.isinf(logits), -1e300, logits.astype(np.float64))
    p = np.exp(finite - finite.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)  # [H, ln 2, ln 4] by hand for rows 1-2
    np.testing.assert_allclose(ref[1:], [np.log(2), np.log(4)], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(rl.entropy_from_logits(logits)), ref, rtol=1e-6)
    grad = jax.grad(lambda z: jnp.sum(rl.entropy_from_logits(z)))(jnp.asarray(logits))
    assert np.all(np.isfinite(np.asarray(grad)))


# ------------------------------ SAPO, Clip-Cov, KL-Cov (hand values) ------------------------------

def test_sapo_hand_values_and_gradient():
    # r = 1: f = σ(0)·4/τ = 2/τ; r = 2, A > 0 (τ = 1): f = 4σ(1); r = 0.5, A < 0 (τ = 1.05): f = 4σ(−0.525)/1.05.
    r = np.array([[1.0, 2.0, 0.5, 1.0]])
    a = np.array([[1.0, 1.0, -1.0, -2.0]], np.float32)
    old = np.full_like(r, -1.0, dtype=np.float32)
    batch = dict(logprobs=(old + np.log(r)).astype(np.float32), old_logprobs=old, advantages=a,
                 loss_mask=np.ones_like(a))
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    f = np.array([2.0, 4 * sig(1.0), 4 * sig(-0.525) / 1.05, 2 / 1.05])
    hand = -f * a[0]
    # ∂ℓ/∂logπ = −A·r·f'(r) with f'(r) = 4σ(τ(r−1))(1 − σ(τ(r−1)))
    tau = np.array([1.0, 1.0, 1.05, 1.05])
    s = sig(tau * (r[0] - 1))
    hand_grad = -a[0] * r[0] * 4 * s * (1 - s) / 4  # token mean over 4 tokens
    loss, metrics, grad = loss_and_grad(batch, cfg(policy_loss_type="sapo"))
    np.testing.assert_allclose(float(loss), hand.mean(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad)[0], hand_grad, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["sapo/gate_mean"]), f.mean(), rtol=1e-6)
    assert "clip_ratio" not in metrics  # the gate never clips (metrics rule)
    with pytest.raises(ValueError, match="sapo_tau_pos"):
        cfg(policy_loss_type="sapo", sapo_tau_pos=0.0)


def _cov_batch():
    """One row of 5 loss tokens (and a masked one) with hand-checkable covariances.
    A = [2, 0, 0, -2, 1], logπ_old = [-1, -2, -3, -4, -5] (+ a masked token with NaN):
    mean A = 0.2, mean logπ_old = -3, cov = (A − .2)(old + 3) = [3.6, -0.2, 0, 2.2, -1.6]."""
    a = np.array([[2.0, 0.0, 0.0, -2.0, 1.0, 7.0]], np.float32)
    old = np.array([[-1.0, -2.0, -3.0, -4.0, -5.0, np.nan]], np.float32)
    m = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
    return dict(logprobs=np.where(m > 0, old + 0.1, 0).astype(np.float32), old_logprobs=old, advantages=a,
                loss_mask=m)


def test_kl_cov_selection_and_loss_by_hand():
    b = _cov_batch()
    np.testing.assert_allclose(np_cov(np.nan_to_num(b["old_logprobs"]), b["advantages"], b["loss_mask"])[0, :5],
                               [3.6, -0.2, 0.0, 2.2, -1.6], atol=1e-12)
    # frac 0.4 of 5 tokens -> k = 2: the covariances 3.6 and 2.2 (tokens 0 and 3)
    config = cfg(policy_loss_type="kl_cov", kl_cov_frac=0.4, ppo_kl_coef=0.5)
    w = weights_of({k: jnp.asarray(v) for k, v in b.items()}, config)
    np.testing.assert_array_equal(np.asarray(w.selected), [[1, 0, 0, 1, 0, 0]])
    loss, metrics, grad = loss_and_grad(b, config)
    r = np.exp(0.1)
    # ℓ = −A·r + s·0.5·|0.1|, token mean over 5 tokens
    hand = -b["advantages"][0, :5] * r + np.array([1, 0, 0, 1, 0]) * 0.05
    np.testing.assert_allclose(float(loss), hand.mean(), rtol=1e-5)
    # ∂ℓ/∂logπ = −A·r + s·0.5·sign(Δ)
    np.testing.assert_allclose(np.asarray(grad)[0, :5], (-b["advantages"][0, :5] * r + np.array([1, 0, 0, 1, 0]) * 0.5) / 5,
                               rtol=1e-5)
    assert float(np.asarray(grad)[0, 5]) == 0.0
    np.testing.assert_allclose(float(metrics["kl_cov/selected_ratio"]), 2 / 5, rtol=1e-6)
    # a fraction below one token still selects one (SkyRL: max(1, ⌊frac·n⌋))
    w = weights_of({k: jnp.asarray(v) for k, v in b.items()}, cfg(policy_loss_type="kl_cov", kl_cov_frac=0.01))
    np.testing.assert_array_equal(np.asarray(w.selected), [[1, 0, 0, 0, 0, 0]])


def test_clip_cov_random_selection_among_candidates():
    b = {k: jnp.asarray(v) for k, v in _cov_batch().items()}
    # candidates lb < cov < ub with (lb, ub) = (-0.1, 3.0): tokens 2 (0.0) and 3 (2.2); ratio 0.2 -> k = 1
    config = cfg(policy_loss_type="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-0.1, clip_cov_ub=3.0)
    picks = np.array([np.asarray(rl.compute_loss_weights(b["loss_mask"], config, old_logprobs=b["old_logprobs"],
                                                         advantages=b["advantages"], rng=jax.random.key(i)).selected)[0]
                      for i in range(40)])
    assert np.all(picks.sum(1) == 1) and set(np.flatnonzero(picks.sum(0))) == {2, 3}  # one of the two, each drawn
    assert 8 <= picks[:, 2].sum() <= 32  # roughly uniform (binomial(40, 1/2): this fails with p < 1e-4)
    # ratio 0.6 -> k = 3 > 2 candidates: both
    w = weights_of(b, cfg(policy_loss_type="clip_cov", clip_cov_ratio=0.6, clip_cov_lb=-0.1, clip_cov_ub=3.0))
    np.testing.assert_array_equal(np.asarray(w.selected), [[0, 0, 1, 1, 0, 0]])
    # the loss: PPO-clip times (1 − s); selected tokens have no gradient
    loss, metrics, grad = loss_and_grad(_cov_batch(), cfg(policy_loss_type="clip_cov", clip_cov_ratio=0.6,
                                                          clip_cov_lb=-0.1, clip_cov_ub=3.0, eps_clip_high=0.2))
    a, r = _cov_batch()["advantages"][0, :5], np.exp(0.1)
    ppo = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2))
    np.testing.assert_allclose(float(loss), (ppo * [1, 1, 0, 0, 1]).mean(), rtol=1e-5)
    assert float(grad[0, 2]) == 0.0 and float(grad[0, 3]) == 0.0 and float(grad[0, 0]) != 0.0
    np.testing.assert_allclose(float(metrics["clip_ratio"]), 2 / 5, rtol=1e-6)
    assert float(metrics["ppo_clip_ratio"]) == 0.0  # r = e^0.1 is inside [0.8, 1.2]
    with pytest.raises(ValueError, match="rng"):
        rl.compute_loss_weights(b["loss_mask"], config, old_logprobs=b["old_logprobs"], advantages=b["advantages"])
    with pytest.raises(ValueError, match="weights.selected"):
        rl.micro_batch_loss(b["logprobs"], b["old_logprobs"], b["advantages"], b["loss_mask"],
                            rl.compute_loss_weights(b["loss_mask"], cfg()), config)
    with pytest.raises(ValueError, match="clip_cov_lb"):
        cfg(policy_loss_type="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0)


# ------------------------------ KL in the reward and its controllers ------------------------------

def test_adaptive_and_fixed_kl_controllers():
    # SkyRL's case: β 0.2, target 0.1, KL 0.2 -> error 1 clipped to 0.2; ×(1 + 0.2·10/100) = 0.204
    np.testing.assert_allclose(rl.update_kl_coef(0.2, 0.2, 10, "adaptive", kl_target=0.1, horizon=100), 0.204)
    # below target: KL 0.05 -> error −0.5 clipped to −0.2 -> 0.2·(1 − 0.2·10/100) = 0.196
    np.testing.assert_allclose(rl.update_kl_coef(0.2, 0.05, 10, "adaptive", kl_target=0.1, horizon=100), 0.196)
    # within the clip: KL 0.11 -> error 0.1 -> 0.2·1.01
    np.testing.assert_allclose(rl.update_kl_coef(0.2, 0.11, 10, "adaptive", kl_target=0.1, horizon=100), 0.202)
    assert rl.update_kl_coef(0.1, 1.0, 10, "fixed") == 0.1
    with pytest.raises(ValueError, match="kl_ctrl_type"):
        rl.update_kl_coef(0.1, 1.0, 10, "pid")
    with pytest.raises(ValueError, match="non-finite"):
        rl.update_kl_coef(0.1, float("nan"), 10, "adaptive")


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_penalized_rewards_against_reference(kind):
    """KL in the reward against float64 numpy, NaN-safe off the loss mask, sharding-invariant."""
    batch = make_batch(13)
    m = batch["loss_mask"]
    rewards = np.zeros_like(m)
    rewards[np.arange(len(m)), np.maximum(m.shape[1] - 1 - np.argmax(m[:, ::-1], 1), 0)] = 1.0  # last loss token
    dirty_old = np.where(m > 0, batch["old_logprobs"], np.nan).astype(np.float32)
    got, metrics = rl.kl_penalized_rewards(rewards, dirty_old, batch["ref_logprobs"], m, 0.3, kind,
                                           sequence_mask=m.sum(1) > 0)
    kl = np_kl(batch["old_logprobs"], batch["ref_logprobs"], kind) * m
    np.testing.assert_allclose(np.asarray(got), rewards - 0.3 * kl, rtol=1e-6, atol=1e-7)
    rows = m.sum(1) > 0
    np.testing.assert_allclose(float(metrics["avg_kl"]), np.mean((kl.sum(1) / np.maximum(m.sum(1), 1))[rows]), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["avg_kl_max"]), np.mean(np.abs(kl).max(1)[rows]), rtol=1e-5)
    # rows sharded over 4 devices (the NaN off the mask included): the same rewards and metrics to 1e-6
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    sh = lambda x: jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("data")))  # noqa: E731
    s_got, s_metrics = jax.jit(lambda r, o, f, mm, rows: rl.kl_penalized_rewards(r, o, f, mm, 0.3, kind, rows))(
        sh(rewards), sh(dirty_old), sh(batch["ref_logprobs"]), sh(m), sh(m.sum(1) > 0))
    np.testing.assert_allclose(np.asarray(s_got), rewards - 0.3 * kl, rtol=1e-6, atol=1e-7)
    for k in metrics:
        np.testing.assert_allclose(float(s_metrics[k]), float(metrics[k]), rtol=1e-6, atol=1e-8)
    got, _ = rl.kl_penalized_rewards(rewards, batch["old_logprobs"], batch["ref_logprobs"], m, -1.0, kind)
    np.testing.assert_array_equal(np.asarray(got), rewards)  # a negative β counts as 0 (SkyRL)


# ------------------------------ the metrics rule: an option that is off reports nothing ------------------------------

RATIO = {"is_ratio_mean", "is_ratio_max", "is_ratio_min"}  # the diagnostics of any off-policy correction
FAMILIES = {  # option settings -> exactly the metric names they add to the default loss's
    "tis_token": (dict(tis_ratio_type="token"), RATIO | {"tis_token_clip_high_ratio"}),
    "tis_sequence": (dict(tis_ratio_type="sequence"), RATIO | {"tis_seq_clip_high_ratio"}),
    "outlier": (dict(outlier_token_is_threshold_high=1e4),
                RATIO | {"outlier_seq_masked_ratio", "outlier_seq_over_high_ratio", "outlier_seq_under_low_ratio"}),
    "token_mask": (dict(token_mask_is_threshold_low=1e-4, token_mask_is_threshold_high=1e4), RATIO | {"token_mask_ratio"}),
    "geo_mask": (dict(sequence_mask_metric="geometric"),
                 RATIO | {f"geo_sequence_mask_{k}_ratio" for k in ("masked", "over_high", "under_low")}),
    "product_mask": (dict(sequence_mask_metric="product"),
                     RATIO | {f"product_sequence_mask_{k}_ratio" for k in ("masked", "over_high", "under_low")}),
    "kl_loss": (dict(kl_loss_coef=0.1), {"kl_loss"}),
    "dual_clip": (dict(policy_loss_type="dual_clip"), {"dual_clip_ratio"}),
    "cispo": (dict(policy_loss_type="cispo"), {"cispo/ratio_mean", "cispo/ratio_clamped_mean", "cispo/ratio_max",
                                               "cispo/ratio_min"}),
    "clip_cov": (dict(policy_loss_type="clip_cov"), {"ppo_clip_ratio"}),
}
# options that replace some of the default loss's metrics: (settings, removed, added)
REPLACING = {
    "cispo": ({"clip_ratio_low", "clip_ratio_high", "ratio_mean", "ratio_max", "ratio_min"}),
    "clip_cov": ({"clip_ratio_low", "clip_ratio_high"}),
}


def test_metrics_of_an_option_are_absent_when_it_is_off():
    """docs/recipes.md "Metrics": a metric is reported iff the option producing it is on."""
    batch = only(make_batch(14), "rollout_logprobs", "ref_logprobs", "entropy")
    _, base, _ = loss_and_grad(batch, cfg())
    default = {"loss", "policy_loss", "approx_kl", "policy_kl", "entropy", "invalid_rollout_seq_ratio",
               "clip_ratio", "clip_ratio_low", "clip_ratio_high", "ratio_mean", "ratio_max", "ratio_min"}
    assert set(base) == default, sorted(set(base) ^ default)
    for family, (options, names) in FAMILIES.items():
        _, metrics, _ = loss_and_grad(batch, cfg(**options))
        assert set(metrics) == (default - REPLACING.get(family, set())) | names, (family, sorted(set(metrics) ^ default))
    # losses without clipping report no clip_ratio (SkyRL logs a constant 0 for them)
    for name, own in (("sapo", {"sapo/gate_mean"}), ("kl_cov", {"kl_cov/selected_ratio", "kl_cov/abs_kl"})):
        _, metrics, _ = loss_and_grad(batch, cfg(policy_loss_type=name))
        assert set(metrics) == default - {"clip_ratio", "clip_ratio_low", "clip_ratio_high"} | own, name
    # diagnostics of an input are absent without it (no μ, no reference, no entropy)
    _, metrics, _ = loss_and_grad(only(make_batch(14)), cfg())
    assert set(metrics) == default - {"policy_kl", "invalid_rollout_seq_ratio", "entropy"}
