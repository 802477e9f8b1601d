"""The critic (Qwen3 trunk + scalar value head) against HF transformers, its sharding, and the
clipped value loss / explained variance against float64 numpy references written here."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl import parallel, rl
from jaxrl.models import critic, hf_io, qwen3
from tiny_hf import make_tiny_hf_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("critic_hf")
    hf = make_tiny_hf_checkpoint(str(path), seed=3, tie_word_embeddings=True, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16)
    cfg, params = hf_io.load_hf_checkpoint(str(path), dtype="float32", remat="none")
    return hf, cfg, params


def _random_head(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {"kernel": jnp.asarray(rng.normal(size=cfg.hidden_size) * 0.3, jnp.float32),
            "bias": jnp.asarray(0.7, jnp.float32)}


def test_values_match_hf_hidden_states_times_head(tiny):
    hf, cfg, params = tiny
    cparams = critic.from_policy_params(params, cfg)
    assert set(cparams) == {"embed_tokens", "layers", "norm", critic.VALUE_HEAD}
    np.testing.assert_array_equal(np.asarray(cparams[critic.VALUE_HEAD]["kernel"]), 0.0)  # initialised to 0
    cparams[critic.VALUE_HEAD] = _random_head(cfg)
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
    pos = np.tile(np.arange(12, dtype=np.int32), (2, 1))
    got = np.asarray(jax.jit(critic.values, static_argnums=1)(cparams, cfg, toks, pos, np.ones_like(toks)))
    with torch.no_grad():
        h = hf.model(torch.tensor(toks, dtype=torch.long)).last_hidden_state.double().numpy()  # after the final norm
    head = cparams[critic.VALUE_HEAD]
    expected = h @ np.asarray(head["kernel"], np.float64) + float(head["bias"])
    assert got.shape == (2, 11)  # target-aligned: the value of the state before token t+1
    np.testing.assert_allclose(got, expected[:, :-1], atol=1e-4)
    assert np.abs(expected).max() > 0.5


def test_layout_and_sharding_follow_the_policy(tiny):
    _, cfg, params = tiny
    axes, paxes = critic.param_logical_axes(cfg), qwen3.param_logical_axes(cfg)
    for k in ("embed_tokens", "layers", "norm"):
        assert axes[k] == paxes[k]
    assert axes[critic.VALUE_HEAD] == {"kernel": ("embed",), "bias": ()}
    shapes = critic.abstract_params(cfg)
    cparams = critic.from_policy_params(params, cfg)
    cparams[critic.VALUE_HEAD] = _random_head(cfg)
    toks = np.random.default_rng(2).integers(0, cfg.vocab_size, (8, 10)).astype(np.int32)
    pos = np.tile(np.arange(10, dtype=np.int32), (8, 1))
    seg = np.ones_like(toks)
    ref = np.asarray(jax.jit(critic.values, static_argnums=1)(cparams, cfg, toks, pos, seg))
    mesh = parallel.make_mesh(2, 2, 2)
    shardings = parallel.param_shardings(axes, mesh, shapes=shapes)
    assert shardings[critic.VALUE_HEAD]["kernel"].spec == P("fsdp")
    sharded = jax.device_put(cparams, shardings)
    with jax.set_mesh(mesh):
        batch = jax.device_put((toks, pos, seg), parallel.batch_sharding(mesh, 2))
        got = np.asarray(jax.jit(critic.values, static_argnums=1)(sharded, cfg, *batch))
    np.testing.assert_allclose(got, ref, atol=1e-5)


# ------------------------------ value loss ------------------------------

def np_value_loss(v, old, ret, m, clip):
    v, old, ret = (np.asarray(x, np.float64) for x in (v, old, ret))
    m = np.asarray(m, bool)
    un = (v - ret) ** 2
    per = un if clip is None else np.maximum((old + np.clip(v - old, -clip, clip) - ret) ** 2, un)
    seq_mean = np.where(m, per, 0).sum(1) / np.maximum(m.sum(1), 1)
    return 0.5 * seq_mean.mean()


def _value_batch(seed, n=8, t=10):
    rng = np.random.default_rng(seed)
    m = np.zeros((n, t), np.float32)
    for i in range(n):
        s, length = rng.integers(0, 3), rng.integers(1, t - 2)
        m[i, s:s + length] = 1
    old = rng.normal(size=(n, t)).astype(np.float32)
    v = (old + rng.normal(size=(n, t)) * 0.4).astype(np.float32)
    ret = (old + rng.normal(size=(n, t))).astype(np.float32)
    return v, old, ret, m


def _vloss(v, old, ret, m, clip, weights=None):
    w = rl.compute_loss_weights(m, rl.LossConfig()) if weights is None else weights
    return jax.value_and_grad(lambda x: rl.value_loss(x, old, ret, m, w, clip), has_aux=True)(jnp.asarray(v))


def test_value_loss_hand_values():
    # one row, two tokens: V = [1, 0], V_old = [0, 0], R = [0.5, 1], clip 0.2
    # token 0: V_clip = 0.2: max((0.2-0.5)^2, (1-0.5)^2) = 0.25 (unclipped larger); token 1: V = 0 = V_clip: 1
    (loss, metrics), grad = _vloss(np.array([[1.0, 0.0]]), np.zeros((1, 2)), np.array([[0.5, 1.0]]),
                                   np.ones((1, 2)), 0.2)
    np.testing.assert_allclose(float(loss), 0.5 * (0.25 + 1.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), [[(1.0 - 0.5) / 2, (0.0 - 1.0) / 2]], rtol=1e-6)
    assert float(metrics["values_clipfrac"]) == 0.0
    # V = [0.5]: V_clip = 0.2, R = 1: clipped (0.64) > unclipped (0.25) -> the clipped branch, no gradient
    (loss, metrics), grad = _vloss(np.array([[0.5]]), np.zeros((1, 1)), np.array([[1.0]]), np.ones((1, 1)), 0.2)
    np.testing.assert_allclose(float(loss), 0.5 * 0.64, rtol=1e-6)
    assert float(grad[0, 0]) == 0.0 and float(metrics["values_clipfrac"]) == 1.0


@pytest.mark.parametrize("clip", [0.2, None])
def test_value_loss_reference_nan_masking_and_micro_batch_invariance(clip):
    v, old, ret, m = _value_batch(0)
    (loss, metrics), grad = _vloss(v, old, ret, m, clip)
    np.testing.assert_allclose(float(loss), np_value_loss(v, old, ret, m, clip), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["values_mean"]), v[m > 0].mean(), rtol=1e-5)
    assert ("values_clipfrac" in metrics) == (clip is not None)  # metrics rule: absent when off
    # NaN / inf off the mask do not leak
    poison = lambda x: np.where(m > 0, x, np.nan).astype(np.float32)  # noqa: E731
    (dl, dm), dg = _vloss(poison(v), poison(old), np.where(m > 0, ret, np.inf).astype(np.float32), m, clip)
    assert float(dl) == float(loss) and np.array_equal(np.asarray(dg), np.asarray(grad))
    assert all(float(dm[k]) == float(metrics[k]) for k in metrics)
    # micro-batches with the mini-batch weights sum to the whole, and a 4-device sharded jit agrees
    w = rl.compute_loss_weights(m, rl.LossConfig())
    parts = rl.split_rows((v, old, ret, m, w), 4)
    outs = [_vloss(*p[:4], clip, weights=p[4]) for p in parts]
    np.testing.assert_allclose(sum(float(o[0][0]) for o in outs), float(loss), rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([np.asarray(o[1]) for o in outs]), np.asarray(grad), rtol=1e-6, atol=1e-9)
    met = functools.reduce(rl.combine_metrics, [o[0][1] for o in outs])
    for k in metrics:
        np.testing.assert_allclose(float(met[k]), float(metrics[k]), rtol=1e-5, atol=1e-7)
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    sh = lambda x: jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("data")))  # noqa: E731
    (sl, _), sg = jax.jit(lambda *xs: _vloss(*xs[:4], clip, weights=xs[4]))(
        sh(v), sh(old), sh(ret), sh(m), jax.tree.map(sh, w))
    np.testing.assert_allclose(float(sl), float(loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(sg), np.asarray(grad), rtol=1e-6, atol=1e-9)


def test_explained_variance():
    v, _, ret, m = _value_batch(1)
    mask = m > 0
    r64, d64 = ret[mask].astype(np.float64), (ret - v)[mask].astype(np.float64)
    np.testing.assert_allclose(float(rl.explained_variance(v, ret, m)), 1 - d64.var() / r64.var(), rtol=1e-5)
    assert float(rl.explained_variance(ret, ret, m)) == 1.0
    assert np.isnan(float(rl.explained_variance(v, np.ones_like(ret), m)))  # Var[R] = 0: undefined
    with pytest.raises(ValueError, match="value_clip"):
        rl.value_loss(v, v, ret, m, rl.compute_loss_weights(m, rl.LossConfig()), 0.0)
