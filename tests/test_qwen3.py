"""Qwen3 model: config parsing, parity with HF transformers (CPU fp32), logprobs, KV cache."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxrl.models import hf_io, qwen3
from jaxrl.models.qwen3 import Qwen3Config
from tiny_hf import make_tiny_hf_checkpoint

_forward = jax.jit(qwen3.forward, static_argnums=1)

# Two architectures: (a) tied, GQA ratio 2, head_dim 32 != 64/4; (b) untied, GQA ratio 4,
# head_dim 16 != 64/8. Both rope_theta 1e6 (tiny_hf default).
ARCHS = {
    "tied_gqa2": dict(tie_word_embeddings=True, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "untied_gqa4": dict(tie_word_embeddings=False, num_attention_heads=8, num_key_value_heads=2, head_dim=16),
}


_BUILT = {}


def _build(name, tmp_path_factory):
    if name not in _BUILT:
        path = tmp_path_factory.mktemp(name)
        hf = make_tiny_hf_checkpoint(str(path), seed=1, **ARCHS[name])
        cfg, params = hf_io.load_hf_checkpoint(str(path), dtype="float32", remat="none")
        _BUILT[name] = hf, cfg, params
    return _BUILT[name]


@pytest.fixture(scope="module", params=sorted(ARCHS))
def hf_and_params(request, tmp_path_factory):
    """Both architectures (parity tests)."""
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def gqa4(tmp_path_factory):
    """One architecture (GQA 4, untied) for the slower gradient / cache / API tests."""
    return _build("untied_gqa4", tmp_path_factory)


def _hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(tokens)[None], dtype=torch.long)).logits[0].double().numpy()


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

def test_config_v4_and_v5_rope_keys_and_head_dim():
    base = dict(model_type="qwen3", vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                tie_word_embeddings=True)
    v4 = Qwen3Config.from_hf_dict({**base, "rope_theta": 5e6, "rope_scaling": None})
    v5 = Qwen3Config.from_hf_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}})
    assert v4 == v5
    assert v4.rope_theta == 5e6 and v4.head_dim == 32 and v4.rms_norm_eps == 1e-5 and v4.tie_word_embeddings
    with pytest.raises(ValueError, match="yarn"):
        Qwen3Config.from_hf_dict({**base, "rope_theta": 1e6,
                                  "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="linear"):
        Qwen3Config.from_hf_dict({**base, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e6}})
    no_hd = dict(base, rope_theta=1e6)
    del no_hd["head_dim"]
    with pytest.raises(ValueError, match="head_dim"):
        Qwen3Config.from_hf_dict(no_hd)
    with pytest.raises(ValueError, match="dtype"):
        Qwen3Config.preset("tiny", dtype="float16")
    with pytest.raises(ValueError, match="remat"):
        Qwen3Config.preset("tiny", remat="sometimes")


def test_config_roundtrips_through_transformers(tmp_path):
    from transformers import AutoConfig

    cfg = Qwen3Config.preset("4B")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert hf.head_dim == 128 and hf.hidden_size == 2560 and hf.tie_word_embeddings
    assert Qwen3Config.from_hf_dict(hf.to_dict(), dtype=cfg.dtype, remat=cfg.remat) == cfg


@pytest.mark.parametrize("name,total", [("0.6B", 0.596e9), ("1.7B", 1.721e9), ("4B", 4.022e9), ("8B", 8.191e9)])
def test_preset_param_counts_match_released_models(name, total):
    # Totals of the released checkpoints (reference notes, computed from HF shapes).
    shapes = qwen3.abstract_params(Qwen3Config.preset(name))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    assert abs(n - total) / total < 1e-3


# ---------------------------------------------------------------------------------------------
# Parity with HF
# ---------------------------------------------------------------------------------------------

def test_logits_match_hf_full_batch(hf_and_params):
    hf, cfg, params = hf_and_params
    toks = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    pos = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    ours = np.asarray(_forward(params, cfg, toks, pos, np.ones_like(toks)))
    with torch.no_grad():
        ref = hf(torch.tensor(toks, dtype=torch.long)).logits.double().numpy()
    assert ours.dtype == np.float32 and ours.shape == (2, 16, cfg.vocab_size)
    assert np.abs(ours - ref).max() <= 1e-4
    assert np.abs(ref).max() > 0.5  # logits are not trivially small


def _mixed_batch(rng, vocab):
    """Row 0 right-padded (11 tokens), row 1 left-padded (9), row 2 packed (7 + 9). T = 16."""
    T = 16
    toks = np.zeros((3, T), np.int32)
    pos = np.zeros((3, T), np.int32)
    seg = np.zeros((3, T), np.int32)
    seqs = [[rng.integers(1, vocab, 11)], [rng.integers(1, vocab, 9)],
            [rng.integers(1, vocab, 7), rng.integers(1, vocab, 9)]]
    spans = [[(0, 11)], [(T - 9, T)], [(0, 7), (7, 16)]]
    for b in range(3):
        for sid, (s, (lo, hi)) in enumerate(zip(seqs[b], spans[b]), start=1):
            toks[b, lo:hi] = s
            pos[b, lo:hi] = np.arange(hi - lo)
            seg[b, lo:hi] = sid
    return toks, pos, seg, seqs, spans


def test_padded_and_packed_rows_match_per_sequence_hf(hf_and_params):
    hf, cfg, params = hf_and_params
    toks, pos, seg, seqs, spans = _mixed_batch(np.random.default_rng(1), cfg.vocab_size)
    ours = np.asarray(_forward(params, cfg, toks, pos, seg))
    assert np.isfinite(ours).all()  # padding rows too
    for b in range(3):
        for s, (lo, hi) in zip(seqs[b], spans[b]):
            assert np.abs(ours[b, lo:hi] - _hf_logits(hf, s)).max() <= 1e-4, (b, lo, hi)


def test_module_call_split_merge(gqa4):
    _, cfg, params = gqa4
    graphdef, p0 = qwen3.split(qwen3.abstract_model(cfg))
    assert jax.tree.structure(p0) == jax.tree.structure(params)
    model = qwen3.merge(graphdef, params)
    toks = np.arange(10, dtype=np.int32)[None] + 5
    pos = np.arange(10, dtype=np.int32)[None]
    call = jax.jit(lambda m, t, p, s: m(t, p, s))
    np.testing.assert_array_equal(np.asarray(call(model, toks, pos, np.ones_like(toks))),
                                  np.asarray(_forward(params, cfg, toks, pos, np.ones_like(toks))))
    axes = qwen3.param_logical_axes(cfg)
    assert axes["layers"]["q_proj"] == ("layers", "embed", "heads", "head_dim")
    assert axes["layers"]["k_proj"] == ("layers", "embed", "kv_heads", "head_dim")
    assert axes["embed_tokens"] == ("vocab", "embed")
    for a, x in zip(jax.tree.leaves(axes, is_leaf=lambda t: isinstance(t, tuple)), jax.tree.leaves(params)):
        assert len(a) == x.ndim


def test_bfloat16_compute_is_close_to_float32_hf(gqa4):
    hf, cfg, params = gqa4
    toks = np.random.default_rng(6).integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    pos = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    ours = np.asarray(_forward(params, cfg.replace(dtype="bfloat16"), toks, pos, np.ones_like(toks)))
    with torch.no_grad():
        ref = hf(torch.tensor(toks, dtype=torch.long)).logits.numpy()
    assert ours.dtype == np.float32
    assert np.abs(ours - ref).max() <= 0.05 * np.abs(ref).max()  # bf16 has 8 mantissa bits


# ---------------------------------------------------------------------------------------------
# logprobs / entropy
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_hf_log_softmax(hf_and_params, temperature):
    hf, cfg, params = hf_and_params
    rng = np.random.default_rng(2)
    toks = rng.integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    pos = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    seg = np.ones_like(toks)
    with torch.no_grad():
        z = hf(torch.tensor(toks, dtype=torch.long)).logits.double().numpy() / temperature
    logp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
    ref_ent = -(np.exp(logp) * logp).sum(-1)
    # Next-token targets (target-aligned, T-1 = 15), chunk 4 does not divide 15 and is < vocab.
    fn = jax.jit(qwen3.logprobs, static_argnums=1, static_argnames=("chunk_size",))
    lp, ent = fn(params, cfg, toks, pos, seg, temperature=temperature, chunk_size=4)
    ref_lp = np.take_along_axis(logp[:, :-1], toks[:, 1:, None], -1)[..., 0]
    assert lp.shape == (2, 15) and lp.dtype == jnp.float32
    assert np.abs(np.asarray(lp) - ref_lp).max() <= 1e-5
    assert np.abs(np.asarray(ent) - ref_ent[:, :-1]).max() <= 1e-5
    # Explicit targets, chunk 5 over T = 16.
    tgt = rng.integers(0, cfg.vocab_size, (2, 16)).astype(np.int32)
    lp2, ent2 = fn(params, cfg, toks, pos, seg, tgt, temperature=temperature, chunk_size=5)
    assert np.abs(np.asarray(lp2) - np.take_along_axis(logp, tgt[..., None], -1)[..., 0]).max() <= 1e-5
    assert np.abs(np.asarray(ent2) - ref_ent).max() <= 1e-5


def test_gradients_chunked_vs_full_softmax_and_remat_policies(gqa4):
    """Chunked logprob/entropy gradients equal those of a full log_softmax; remat policies agree."""
    _, cfg, params = gqa4
    toks = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
    pos = np.tile(np.arange(12, dtype=np.int32), (2, 1))
    seg = np.ones_like(toks)

    def chunked(p, c):
        lp, ent = qwen3.logprobs(p, c, toks, pos, seg, temperature=0.7, chunk_size=5)
        return lp.sum() + 0.1 * ent.sum()

    def full(p, c):
        z = qwen3.forward(p, c, toks, pos, seg)[:, :-1] / 0.7
        ls = jax.nn.log_softmax(z)
        lp = jnp.take_along_axis(ls, toks[:, 1:, None], -1)[..., 0]
        return lp.sum() + 0.1 * (-(jnp.exp(ls) * ls).sum(-1)).sum()

    ref = jax.jit(jax.grad(full), static_argnums=1)(params, cfg)  # remat "none"
    for remat in ("full", "save_dots"):
        g = jax.jit(jax.grad(chunked), static_argnums=1)(params, cfg.replace(remat=remat))
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref)):
            a, b = np.asarray(a), np.asarray(b)
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), remat  # reduction-order noise only


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------

def test_kv_cache_prefill_and_decode_equal_full_forward(gqa4):
    _, cfg, params = gqa4
    rng = np.random.default_rng(5)
    B, P, G, C = 3, 6, 5, 16          # prompt bucket 6, 5 decode steps, 16 cache slots
    lens = [6, 3, 1]                   # mixed prompt lengths, left-padded
    T = P + G
    toks = np.zeros((B, T), np.int32)
    pos = np.zeros((B, T), np.int32)
    seg = np.zeros((B, T), np.int32)
    for b, n in enumerate(lens):
        toks[b, P - n:] = rng.integers(1, cfg.vocab_size, n + G)
        pos[b, P - n:] = np.arange(n + G)
        seg[b, P - n:] = 1
    full = np.asarray(_forward(params, cfg, toks, pos, seg))

    step = jax.jit(qwen3.forward_with_cache, static_argnums=(1, 8))
    cache = qwen3.init_cache(cfg, B, C)
    assert cache["k"].shape == (cfg.num_hidden_layers, B, C, cfg.num_key_value_heads, cfg.head_dim)
    out = step(params, cfg, toks[:, :P], pos[:, :P], seg[:, :P] > 0, cache, jnp.zeros((B, C), bool), 0, False)
    for b, n in enumerate(lens):
        assert np.abs(np.asarray(out.logits)[b, P - n:] - full[b, P - n:P]).max() <= 1e-5
    np.testing.assert_array_equal(np.asarray(out.cache_mask)[:, :P], seg[:, :P] > 0)
    cache, cmask = out.cache, out.cache_mask
    for t in range(P, T):
        out = step(params, cfg, toks[:, t:t + 1], pos[:, t:t + 1], np.ones((B, 1), bool), cache, cmask, t, True)
        assert out.logits.shape == (B, 1, cfg.vocab_size)
        assert np.abs(np.asarray(out.logits)[:, 0] - full[:, t]).max() <= 1e-5, t
        cache, cmask = out.cache, out.cache_mask
    assert np.asarray(cmask).sum() == sum(lens) + B * G
    # last_only prefill gives the last position's logits.
    last = step(params, cfg, toks[:, :P], pos[:, :P], seg[:, :P] > 0, qwen3.init_cache(cfg, B, C),
                jnp.zeros((B, C), bool), 0, True)
    assert np.abs(np.asarray(last.logits)[:, 0] - full[:, P - 1]).max() <= 1e-5
