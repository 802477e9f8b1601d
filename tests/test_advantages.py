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


def ref_reinforce_pp(r, elig):
    vals = np.asarray(r, np.float64)[elig]
    out = np.zeros(len(r))
    if len(vals) < 2:
        return out
    mean, var = vals.mean(), vals.var(ddof=1)
    out[elig] = (vals - mean) / np.sqrt(var + 1e-8)
    return out


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
    # a batch with a single trajectory: reinforce_pp cannot whiten → 0, not NaN
    assert float(rl.reinforce_pp(jnp.array([3.0]), jnp.array([0]))[0]) == 0.0


@pytest.mark.parametrize("name", ["rloo", "rloo_n", "grpo", "reinforce_pp"])
def test_equal_rewards_give_exactly_zero(name):
    r = jnp.full((6,), 0.1, jnp.float32)  # 0.1 is not exact in binary: sums would round
    g = jnp.array([3, 8, 3, 8, 3, 8])
    out = rl.compute_advantages(r, g, config=rl.AdvantageConfig(advantage_estimator=name))
    np.testing.assert_array_equal(np.asarray(out), np.zeros(6))
    dr = rl.grpo(r, g, config=rl.AdvantageConfig(grpo_norm_by_std=False))
    np.testing.assert_array_equal(np.asarray(dr), np.zeros(6))


def test_reinforce_pp_hand_values():
    # rewards 1, 0, 0, 1 (eligible) and one failed 5: mean .5, unbiased var 1/3
    r = jnp.array([1.0, 0.0, 5.0, 0.0, 1.0])
    m = jnp.array([True, True, False, True, True])
    z = 0.5 / np.sqrt(1 / 3 + 1e-8)
    np.testing.assert_allclose(np.asarray(rl.reinforce_pp(r, jnp.arange(5), m)), [z, -z, 0, -z, z], rtol=1e-6)


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
        "reinforce_pp": ref_reinforce_pp(r64, elig),
    }
    for name, expected in cases.items():
        cfg = rl.AdvantageConfig(advantage_estimator=name, group_advantage_min_size=3)
        got = jax.jit(lambda a, b, c, cfg=cfg: rl.compute_advantages(a, b, c, cfg))(jr, jg, je)
        assert np.all(np.isfinite(np.asarray(got))), name
        np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5, err_msg=name)
    dr = rl.grpo(jr, jg, je, rl.AdvantageConfig(grpo_norm_by_std=False))
    np.testing.assert_allclose(np.asarray(dr), ref_grpo(r64, g, elig, norm_by_std=False), rtol=1e-5, atol=1e-6)


def test_no_nan_when_whole_group_excluded():
    r = jnp.array([1.0, 2.0, 3.0, 4.0])
    g = jnp.array([0, 0, 1, 1])
    m = jnp.array([False, False, True, True])
    for name in rl.list_advantage_estimators():
        out = np.asarray(rl.compute_advantages(r, g, m, rl.AdvantageConfig(advantage_estimator=name)))
        assert np.all(np.isfinite(out)) and out[0] == 0 and out[1] == 0, name
    none = jnp.zeros(4, bool)
    for name in rl.list_advantage_estimators():
        out = np.asarray(rl.compute_advantages(r, g, none, rl.AdvantageConfig(advantage_estimator=name)))
        np.testing.assert_array_equal(out, np.zeros(4))


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
    with pytest.raises(ValueError, match=r"Unknown advantage estimator 'nope'.*grpo, reinforce_pp, rloo, rloo_n"):
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


def test_non_finite_rewards_stop_with_a_message_unless_excluded():
    g = jnp.array([0, 0, 1, 1])
    for name in rl.list_advantage_estimators():
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
