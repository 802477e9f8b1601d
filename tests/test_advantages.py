"""Advantage estimators against hand-computed values and a float64 numpy reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import rl
from jaxrl.rl import advantages as adv
from jaxrl.rl import registry


# ---------------- independent float64 references (loops, no shared code) ----------------

def ref_rloo(r, g, elig, min_size=2):
    out = np.zeros(len(r))
    for i in range(len(r)):
        if not elig[i]:
            continue
        members = [j for j in range(len(r)) if g[j] == g[i] and elig[j]]
        if len(members) < min_size:
            continue
        others = [r[j] for j in members if j != i]
        out[i] = r[i] - np.mean(others)
    return out


def ref_grpo(r, g, elig, norm_by_std=True, eps=1e-6):
    out = np.zeros(len(r))
    for i in range(len(r)):
        if not elig[i]:
            continue
        vals = np.array([r[j] for j in range(len(r)) if g[j] == g[i] and elig[j]], np.float64)
        if len(vals) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = vals.mean(), vals.std(ddof=1)
        out[i] = (r[i] - mean) / (std + eps) if norm_by_std else r[i] - mean
    return out


def ref_maxrl(r, g, elig, eps=1e-6):
    out = np.zeros(len(r))
    for i in range(len(r)):
        if not elig[i]:
            continue
        vals = [r[j] for j in range(len(r)) if g[j] == g[i] and elig[j]]
        out[i] = r[i] if len(vals) == 1 else (r[i] - np.mean(vals)) / (np.mean(vals) + eps)
    return out


def ref_returns(r, m, gamma):
    """Reward-to-go along each row's response span, by a loop (float64)."""
    out = np.zeros_like(r, dtype=np.float64)
    for i in range(r.shape[0]):
        run = 0.0
        for t in reversed(range(r.shape[1])):
            if not m[i, t]:
                run = 0.0
                continue
            run = r[i, t] + gamma * run
            out[i, t] = run
    return out


def ref_whiten(x, mask):
    vals = x[mask]
    out = np.zeros_like(x, dtype=np.float64)
    if len(vals) < 2:
        return out
    out[mask] = (vals - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8)
    return out


def ref_gae(r, v, m, gamma, lam):
    """δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γλ A_{t+1} by a loop, V and A := 0 after the response."""
    adv = np.zeros_like(r, dtype=np.float64)
    for i in range(r.shape[0]):
        last, next_v = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if not m[i, t]:
                last, next_v = 0.0, 0.0
                continue
            delta = r[i, t] + gamma * next_v - v[i, t]
            last = delta + gamma * lam * last
            adv[i, t] = last
            next_v = v[i, t]
    return adv, np.where(m, adv + v, 0.0)


def random_batch(seed, n=24):
    rng = np.random.default_rng(seed)
    # arbitrary, non-contiguous ids (negative and large), some singleton groups
    ids = rng.choice(np.array([-7, 3, 1000003, 42, 5, 2**30]), size=n)
    ids[0] = 77777  # guaranteed group of one
    rewards = rng.normal(size=n).astype(np.float32)
    rewards[rng.random(n) < 0.3] = 1.0  # ties
    elig = rng.random(n) > 0.2
    return rewards, ids.astype(np.int32), elig


# ---------------- hand-computed values ----------------

def test_rloo_skyrl_vectors():
    # SkyRL's RLOO examples: [6,3] → [3,−3]; [9,12] → [−3,3]; [1] → [0]; groups interleaved.
    r = jnp.array([6.0, 9.0, 1.0, 3.0, 12.0])
    g = jnp.array([10, 20, 30, 10, 20])
    np.testing.assert_array_equal(np.asarray(rl.rloo(r, g)), [3.0, -3.0, 0.0, -3.0, 3.0])
    np.testing.assert_array_equal(np.asarray(rl.rloo_n(r, g)), [3.0, -3.0, 0.0, -3.0, 3.0])


def test_rloo_n_excludes_failed_member_from_baseline():
    # group 0: rewards 1, 0, 0.5 eligible, 10 failed (infrastructure). RLOO over n=3:
    # A_0 = 1 − (0 + 0.5)/2 = 0.75; A_1 = 0 − 0.75 = −0.75; A_2 = 0.5 − 0.5 = 0; failed → 0.
    r = jnp.array([1.0, 0.0, 0.5, 10.0])
    g = jnp.array([0, 0, 0, 0])
    mask = jnp.array([True, True, True, False])
    np.testing.assert_allclose(np.asarray(rl.rloo_n(r, g, mask)), [0.75, -0.75, 0.0, 0.0], atol=1e-7)
    # without the mask the failed reward would enter the baseline: A_0 = 1 − 10.5/3 = −2.5
    np.testing.assert_allclose(np.asarray(rl.rloo_n(r, g))[0], -2.5, atol=1e-6)


def test_rloo_n_min_group_size():
    # group 1 has 3 eligible members (4th failed) < min size 4 → all zero; group 2 has 4 → RLOO.
    r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    g = jnp.array([1, 2, 1, 2, 1, 2, 1, 2])
    mask = jnp.array([True, True, True, True, True, True, False, True])
    cfg = rl.AdvantageConfig(group_advantage_min_size=4)
    out = np.asarray(rl.rloo_n(r, g, mask, cfg))
    # group 2 rewards (0,1,0,0): A = r − mean(others): 0−1/3, 1−0, 0−1/3, 0−1/3
    np.testing.assert_allclose(out, [0, -1 / 3, 0, 1.0, 0, -1 / 3, 0, -1 / 3], atol=1e-6)


def test_group_of_one():
    r = jnp.array([0.7, 2.0, 4.0])
    g = jnp.array([5, 9, 9])
    assert float(rl.rloo(r, g)[0]) == 0.0
    assert float(rl.rloo_n(r, g)[0]) == 0.0
    # GRPO follows SkyRL: mean := 0, std := 1 → 0.7 / (1 + 1e-6); Dr. GRPO → 0.7
    np.testing.assert_allclose(float(rl.grpo(r, g)[0]), 0.7 / (1 + 1e-6), rtol=1e-7)
    dr = rl.AdvantageConfig(grpo_norm_by_std=False)
    np.testing.assert_allclose(float(rl.grpo(r, g, config=dr)[0]), 0.7, rtol=1e-7)
    # group (2, 4): mean 3, unbiased std sqrt(2) → ±1/(sqrt 2 + 1e-6)
    np.testing.assert_allclose(np.asarray(rl.grpo(r, g))[1:], [-1 / (2**0.5 + 1e-6), 1 / (2**0.5 + 1e-6)], rtol=1e-6)
    # MaxRL follows SkyRL: a group of one gets A = r
    np.testing.assert_allclose(float(rl.maxrl(r, g)[0]), 0.7, rtol=1e-7)
    # a batch with a single loss token: reinforce_pp cannot whiten → 0, not NaN
    adv, ret = rl.reinforce_pp(jnp.array([[3.0]]), jnp.array([[1]]), jnp.array([[1]]))
    assert float(adv[0, 0]) == 0.0 and float(ret[0, 0]) == 3.0


@pytest.mark.parametrize("name", ["rloo", "rloo_n", "grpo", "maxrl"])
def test_equal_rewards_give_exactly_zero(name):
    r = jnp.full((6,), 0.1, jnp.float32)  # 0.1 is not exact in binary: sums would round
    g = jnp.array([3, 8, 3, 8, 3, 8])
    out = rl.compute_advantages(r, g, config=rl.AdvantageConfig(advantage_estimator=name))
    np.testing.assert_array_equal(np.asarray(out), np.zeros(6))
    dr = rl.grpo(r, g, config=rl.AdvantageConfig(grpo_norm_by_std=False))
    np.testing.assert_array_equal(np.asarray(dr), np.zeros(6))


def test_equal_returns_give_exactly_zero_token_level():
    # one reward of 0.1 on the last token of every row (lengths 3 and 2), γ = 1: every return is 0.1
    r = jnp.array([[0.0, 0.0, 0.1, 0.0], [0.0, 0.1, 0.0, 0.0]])
    m = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = rl.reinforce_pp(r, m, m)
    np.testing.assert_array_equal(np.asarray(adv), np.zeros((2, 4)))
    np.testing.assert_allclose(np.asarray(ret), 0.1 * np.asarray(m), rtol=1e-6)


def test_reinforce_pp_hand_values():
    # four one-token responses with rewards 1, 0, 0, 1 and one failed row (5): mean .5, unbiased var 1/3
    r = jnp.array([[1.0], [0.0], [5.0], [0.0], [1.0]])
    ones = jnp.ones((5, 1))
    keep = jnp.array([True, True, False, True, True])
    z = 0.5 / np.sqrt(1 / 3 + 1e-8)
    adv, ret = rl.compute_advantages_and_returns(r, ones, jnp.arange(5), baseline_mask=keep,
                                                 config=rl.AdvantageConfig(advantage_estimator="reinforce_pp"))
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [z, -z, 0, -z, z], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[:, 0], [1, 0, 0, 0, 1])  # the failed row: 0


def test_reinforce_pp_discounted_returns_skyrl_vectors():
    # SkyRL's cases: rewards [1, 2, 3] on one response, γ = 0.5 -> returns [2.75, 3.5, 3.0].
    r = jnp.array([[1.0, 2.0, 3.0]])
    ones = jnp.ones((1, 3))
    adv, ret = rl.reinforce_pp(r, ones, ones, config=rl.AdvantageConfig(gamma=0.5))
    np.testing.assert_allclose(np.asarray(ret), [[2.75, 3.5, 3.0]], rtol=1e-6)
    # whitened over the 3 tokens: mean 3.0833, unbiased std
    g = np.array([2.75, 3.5, 3.0])
    np.testing.assert_allclose(np.asarray(adv)[0], (g - g.mean()) / np.sqrt(g.var(ddof=1) + 1e-8), rtol=1e-5)
    # γ = 1 with the response ending after 2 tokens (right padding here; SkyRL pads on the left):
    # returns [3, 2] and nothing after the response (SkyRL's [3, 2, 3] counts the padding's reward)
    adv, ret = rl.reinforce_pp(r, jnp.array([[1, 1, 0]]), jnp.array([[1, 1, 0]]))
    np.testing.assert_allclose(np.asarray(ret), [[3.0, 2.0, 0.0]])
    assert float(adv[0, 2]) == 0.0


def test_maxrl_skyrl_vectors():
    # SkyRL's case: groups [6, 3] (mean 4.5) and [9, 12] (mean 10.5): A = (s − mean)/(mean + 1e-6)
    r = jnp.array([6.0, 3.0, 9.0, 12.0])
    g = jnp.array([0, 0, 1, 1])
    expected = [1.5 / (4.5 + 1e-6), -1.5 / (4.5 + 1e-6), -1.5 / (10.5 + 1e-6), 1.5 / (10.5 + 1e-6)]
    np.testing.assert_allclose(np.asarray(rl.maxrl(r, g)), expected, rtol=1e-6)
    # binary rewards: one success in 4 (p = 1/4): success (1 − p)/p = 3, failures −1
    np.testing.assert_allclose(np.asarray(rl.maxrl(jnp.array([1.0, 0.0, 0.0, 0.0]), jnp.zeros(4, jnp.int32))),
                               [0.75 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6)],
                               rtol=1e-6)
    # via token rewards: the score is the row's sum (SkyRL token_level_rewards.sum(-1))
    tok = jnp.array([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0], [4.0, 4.0, 4.0]])
    adv, ret = rl.compute_advantages_and_returns(tok, jnp.ones((4, 3)), g, config=rl.AdvantageConfig(advantage_estimator="maxrl"))
    np.testing.assert_allclose(np.asarray(adv), np.repeat(np.array(expected)[:, None], 3, 1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[0], [6.0, 5.0, 3.0])  # reward-to-go
    with pytest.raises(ValueError, match="rewards >= 0"):
        rl.maxrl(jnp.array([1.0, -1.0]), jnp.array([0, 0]))


def test_gae_skyrl_vectors():
    # SkyRL's cases: rewards [1, 2, 3], values [0.5, 1, 1.5]
    r, v, ones = jnp.array([[1.0, 2.0, 3.0]]), jnp.array([[0.5, 1.0, 1.5]]), jnp.ones((1, 3))
    for gamma, lam, expected in ((1.0, 1.0, [6.0, 5.0, 3.0]), (0.5, 1.0, [2.75, 3.5, 3.0]), (1.0, 0.5, [3.625, 4.25, 3.0])):
        adv, ret = rl.gae(r, ones, ones, values=v, config=rl.AdvantageConfig(gamma=gamma, lambd=lam))
        np.testing.assert_allclose(np.asarray(ret), [expected], rtol=1e-6, err_msg=str((gamma, lam)))
    # whitening over the loss tokens [1, 0, 1]: raw A = [5.5, 4, 1.5]; tokens 0 and 2: mean 3.5,
    # unbiased var 8 -> ±2/sqrt(8) = ±0.7071 (SkyRL: same values; it also leaves 0.1768 on token 1)
    adv, ret = rl.gae(r, ones, jnp.array([[1, 0, 1]]), values=v)
    np.testing.assert_allclose(np.asarray(adv), [[2 / np.sqrt(8 + 1e-8), 0.0, -2 / np.sqrt(8 + 1e-8)]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), [[6.0, 5.0, 3.0]], rtol=1e-6)
    with pytest.raises(ValueError, match="values"):
        rl.compute_advantages_and_returns(r, ones, jnp.array([0]), config=rl.AdvantageConfig(advantage_estimator="gae"))


def _token_batch(seed, n=10, t=12):
    """Right-padded rows: a prompt part (outside the response), a response of varied length whose
    first tokens are generated (loss tokens) and whose tail may be observation tokens."""
    rng = np.random.default_rng(seed)
    resp = np.zeros((n, t), bool)
    loss = np.zeros((n, t), bool)
    for i in range(n):
        p, length = rng.integers(0, 4), rng.integers(1, t - 3)
        resp[i, p:p + length] = True
        loss[i, p:p + length] = rng.random(length) < 0.8
        loss[i, p] = True
    r = np.where(resp, rng.normal(size=(n, t)) * (rng.random((n, t)) < 0.3), 0.0).astype(np.float32)
    v = rng.normal(size=(n, t)).astype(np.float32)
    g = rng.integers(0, 3, size=n).astype(np.int32)
    elig = rng.random(n) > 0.2
    return r, v, resp, loss, g, elig


@pytest.mark.parametrize("seed", [0, 1])
def test_token_level_estimators_match_numpy_reference(seed):
    r, v, resp, loss, g, elig = _token_batch(seed)
    gamma, lam = 0.9, 0.7
    m = resp & elig[:, None]
    lm = loss & m
    cfg = lambda name: rl.AdvantageConfig(advantage_estimator=name, gamma=gamma, lambd=lam)  # noqa: E731
    fn = jax.jit(lambda *xs, c: rl.compute_advantages_and_returns(xs[0], xs[1], xs[2], loss_mask=xs[3],
                                                                   baseline_mask=xs[4], values=xs[5], config=c),
                 static_argnames="c")
    args = (r, resp, g, loss, elig, v)
    # reinforce++ (and its SkyRL alias)
    ret = ref_returns(r.astype(np.float64), m, gamma)
    for name in ("reinforce_pp", "reinforce++"):
        adv_j, ret_j = fn(*args, c=cfg(name))
        np.testing.assert_allclose(np.asarray(ret_j), ret, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(adv_j), ref_whiten(ret, lm), rtol=1e-4, atol=1e-5)
    # gae
    raw, ret = ref_gae(r.astype(np.float64), v.astype(np.float64), m, gamma, lam)
    adv_j, ret_j = fn(*args, c=cfg("gae"))
    np.testing.assert_allclose(np.asarray(ret_j), ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(adv_j), ref_whiten(raw, lm), rtol=1e-4, atol=1e-5)
    # outcome estimators: the row sum as the score, placed on the loss tokens; returns = reward-to-go
    scores = np.where(m, r, 0).sum(1).astype(np.float64)
    for name, ref in (("rloo", ref_rloo(scores, g, elig)), ("grpo", ref_grpo(scores, g, elig))):
        adv_j, ret_j = fn(*args, c=cfg(name))
        np.testing.assert_allclose(np.asarray(adv_j), np.where(lm, ref[:, None], 0.0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ret_j), ref_returns(r.astype(np.float64), m, gamma), rtol=1e-5, atol=1e-6)


def test_token_level_nan_safety_and_sharding_invariance():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    r, v, resp, loss, g, elig = _token_batch(3, n=8)
    r = np.abs(r)  # maxrl needs rewards >= 0
    elig[:] = True
    elig[5] = False
    clean = {}
    for name in ("gae", "reinforce_pp", "maxrl", "rloo"):
        c = rl.AdvantageConfig(advantage_estimator=name, gamma=0.95, lambd=0.9)
        clean[name] = [np.asarray(x) for x in rl.compute_advantages_and_returns(
            r, resp, g, loss_mask=loss, baseline_mask=elig, values=v, config=c)]
        # NaN / inf off the response and on the excluded row change nothing
        off = ~resp | ~elig[:, None]
        dirty_r = np.where(off, np.nan, r).astype(np.float32)
        dirty_v = np.where(off, np.inf, v).astype(np.float32)
        got = rl.compute_advantages_and_returns(dirty_r, resp, g, loss_mask=loss, baseline_mask=elig, values=dirty_v,
                                                config=c)
        for a, b in zip(got, clean[name]):
            np.testing.assert_array_equal(np.asarray(a), b)
        # on an eligible response: a clear error naming the entry
        bad = r.copy()
        i, t = np.argwhere(resp & elig[:, None])[0]
        bad[i, t] = np.nan
        with pytest.raises(ValueError, match=rf"token_rewards\[{i}, {t}\] = nan"):
            rl.compute_advantages_and_returns(bad, resp, g, loss_mask=loss, baseline_mask=elig, values=v, config=c)
        # rows sharded over 4 devices: the same numbers to 1e-6
        mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
        sh = lambda x: jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("data")))  # noqa: E731
        got = jax.jit(lambda *xs: rl.compute_advantages_and_returns(xs[0], xs[1], xs[2], loss_mask=xs[3],
                                                                     baseline_mask=xs[4], values=xs[5], config=c))(
            *map(sh, (r, resp, g, loss, elig, v)))
        for a, b in zip(got, clean[name]):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-6)


# ---------------- random batches against the float64 reference ----------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimators_match_numpy_reference(seed):
    r, g, elig = random_batch(seed)
    jr, jg, je = jnp.asarray(r), jnp.asarray(g), jnp.asarray(elig)
    r64 = r.astype(np.float64)
    cases = {
        "rloo": ref_rloo(r64, g, elig),
        "rloo_n": ref_rloo(r64, g, elig, min_size=3),
        "grpo": ref_grpo(r64, g, elig),
    }
    for name, expected in cases.items():
        cfg = rl.AdvantageConfig(advantage_estimator=name, group_advantage_min_size=3)
        got = jax.jit(lambda a, b, c, cfg=cfg: rl.compute_advantages(a, b, c, cfg))(jr, jg, je)
        assert np.all(np.isfinite(np.asarray(got))), name
        np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5, err_msg=name)
    dr = rl.grpo(jr, jg, je, rl.AdvantageConfig(grpo_norm_by_std=False))
    np.testing.assert_allclose(np.asarray(dr), ref_grpo(r64, g, elig, norm_by_std=False), rtol=1e-5, atol=1e-6)
    pos = np.abs(r)  # MaxRL needs rewards >= 0
    got = jax.jit(lambda a, b, c: rl.maxrl(a, b, c))(jnp.asarray(pos), jg, je)
    np.testing.assert_allclose(np.asarray(got), ref_maxrl(pos.astype(np.float64), g, elig), rtol=2e-5, atol=2e-5)


def test_no_nan_when_whole_group_excluded():
    r = jnp.array([1.0, 2.0, 3.0, 4.0])
    g = jnp.array([0, 0, 1, 1])
    m = jnp.array([False, False, True, True])
    outcome = [n for n in rl.list_advantage_estimators() if not rl.is_token_level_estimator(n)]
    for name in outcome:
        out = np.asarray(rl.compute_advantages(r, g, m, rl.AdvantageConfig(advantage_estimator=name)))
        assert np.all(np.isfinite(out)) and out[0] == 0 and out[1] == 0, name
    none = jnp.zeros(4, bool)
    for name in rl.list_advantage_estimators():  # every estimator, through the token-level entry point
        adv_t, ret_t = rl.compute_advantages_and_returns(r[:, None], jnp.ones((4, 1)), g, baseline_mask=none,
                                                         values=jnp.ones((4, 1)),
                                                         config=rl.AdvantageConfig(advantage_estimator=name))
        np.testing.assert_array_equal(np.asarray(adv_t), np.zeros((4, 1)), err_msg=name)
        np.testing.assert_array_equal(np.asarray(ret_t), np.zeros((4, 1)), err_msg=name)


# ---------------- helpers, registry, errors ----------------

def test_broadcast_and_gather_to_tokens():
    a = jnp.array([2.0, -1.0])
    mask = jnp.array([[0, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(np.asarray(rl.broadcast_to_tokens(a, mask)), [[0, 2, 2, 0], [-1, -1, 0, 0]])
    # one packed row holding trajectories 2 then 0; index -1 = no trajectory
    values = jnp.array([5.0, 6.0, 7.0])
    index = jnp.array([[2, 2, 0, 0, -1]])
    pmask = jnp.array([[1, 0, 1, 1, 1]])
    np.testing.assert_array_equal(np.asarray(rl.gather_to_tokens(values, index, pmask)), [[7, 0, 5, 5, 0]])
    with pytest.raises(ValueError, match="loss_mask"):
        rl.broadcast_to_tokens(a, jnp.ones((3, 4)))


def test_registry_custom_estimator_and_unknown_name():
    name = "test_mean_baseline"

    @rl.register_advantage_estimator(name)
    def mean_baseline(rewards, group_ids, baseline_mask, config):
        return rewards - jnp.mean(rewards)

    try:
        out = rl.compute_advantages(jnp.array([1.0, 3.0]), jnp.array([0, 1]),
                                    config=rl.AdvantageConfig(advantage_estimator=name))
        np.testing.assert_allclose(np.asarray(out), [-1.0, 1.0])
        with pytest.raises(ValueError, match="already registered"):
            rl.register_advantage_estimator(name)(lambda *a: None)
    finally:
        registry.ADVANTAGE_ESTIMATORS.pop(name)
    with pytest.raises(ValueError, match=r"Unknown advantage estimator 'nope'.*gae, grpo, maxrl, reinforce\+\+, "
                                         r"reinforce_pp, rloo, rloo_n"):
        rl.compute_advantages(jnp.ones(2), jnp.zeros(2, jnp.int32), config=rl.AdvantageConfig(advantage_estimator="nope"))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="group_advantage_min_size"):
        rl.AdvantageConfig(group_advantage_min_size=1)
    with pytest.raises(ValueError, match="group_ids"):
        rl.rloo(jnp.ones(3), jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match="integers"):
        rl.rloo(jnp.ones(3), jnp.zeros(3))
    with pytest.raises(ValueError, match="baseline_mask"):
        rl.grpo(jnp.ones(3), jnp.zeros(3, jnp.int32), jnp.ones(2, bool))
    assert adv.GRPO_EPSILON == 1e-6
    for name in ("gamma", "lambd"):
        with pytest.raises(ValueError, match=name):
            rl.AdvantageConfig(**{name: 1.5})
    with pytest.raises(ValueError, match="token-level"):
        rl.compute_advantages(jnp.ones(2), jnp.zeros(2, jnp.int32), config=rl.AdvantageConfig(advantage_estimator="gae"))
    assert rl.estimator_needs_values("gae") and rl.is_token_level_estimator("reinforce++")
    assert not rl.estimator_needs_values("reinforce_pp") and not rl.is_token_level_estimator("maxrl")


def test_non_finite_rewards_stop_with_a_message_unless_excluded():
    g = jnp.array([0, 0, 1, 1])
    for name in [n for n in rl.list_advantage_estimators() if not rl.is_token_level_estimator(n)]:
        c = rl.AdvantageConfig(advantage_estimator=name)
        with pytest.raises(ValueError, match=r"reward\[1\] = nan"):
            rl.compute_advantages(np.array([1.0, np.nan, 0.0, 1.0], np.float32), g, None, c)
        with pytest.raises(ValueError, match=r"reward\[3\] = inf"):
            rl.compute_advantages(np.array([1.0, 0.0, 0.0, np.inf], np.float32), g, None, c)
        # Excluded members' rewards never matter (an env_error trajectory may carry anything).
        out = rl.compute_advantages(np.array([1.0, np.nan, 0.0, 1.0], np.float32), g,
                                    np.array([True, False, True, True]), c)
        assert np.all(np.isfinite(np.asarray(out))) and float(out[1]) == 0.0, name
    # Under jit the values are traced and not checked (shape checks still run).
    jitted = jax.jit(lambda r: rl.rloo(r, g))(jnp.array([1.0, 0.0, 2.0, 2.0]))
    np.testing.assert_allclose(np.asarray(jitted), [1.0, -1.0, 0.0, 0.0])
