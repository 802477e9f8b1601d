"""YaRN RoPE scaling (jaxrl/models/rope.py) against transformers: the inverse frequencies and the
attention factor, config.json parsing, and the logits of a tiny YaRN checkpoint at positions past
its original_max_position_embeddings, in the training forward and in the engine's prefill and
decode steps (float32, CPU)."""
import json

import jax
import numpy as np
import pytest
import torch

from jaxrl.models import hf_io, qwen3, rope
from jaxrl.models.qwen3 import Qwen3Config
from tiny_hf import make_tiny_hf_checkpoint

# The tiny YaRN model: trained context L = 64 positions, factor 4 (256 positions), head_dim 16,
# base 1e4: the ramp runs over dimension pairs 0..3 of 8 (transformers' truncated range [0, 3]), so
# the test sees kept, blended and interpolated frequencies.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
TINY = dict(rope_theta=1e4, max_position_embeddings=256, head_dim=16, num_attention_heads=4, num_key_value_heads=2)
T = 200  # tokens of the parity sequences: positions 64..199 are past the trained context


def _hf_inv_freq(head_dim, theta, rope_parameters, max_position_embeddings):
    from transformers import Qwen3Config as HFConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = HFConfig(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=max_position_embeddings,
                   rope_parameters={**rope_parameters, "rope_theta": theta})
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    return inv.numpy(), float(factor)


@pytest.mark.parametrize("head_dim,theta,params,max_pos", [
    (128, 1e6, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 40960),  # Qwen3-8B
    (128, 1e6, {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}, 65536),
    (16, 1e4, YARN, 256),
    (16, 1e4, {**YARN, "truncate": False}, 256),
    (32, 1e4, {**YARN, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.5}, 256),
    (32, 5e5, {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0}, 256),
    (64, 1e4, {"rope_type": "yarn", "factor": 8.0}, 64),  # original_max_position_embeddings = max_position_embeddings
])
def test_yarn_frequencies_and_attention_factor_match_transformers(head_dim, theta, params, max_pos):
    scaling = rope.RopeScaling.from_hf(params, max_pos)
    inv, factor = rope.inverse_frequencies(head_dim, theta, scaling)
    ref_inv, ref_factor = _hf_inv_freq(head_dim, theta, params, max_pos)
    assert inv.dtype == np.float32 and inv.shape == (head_dim // 2,)
    np.testing.assert_allclose(inv, ref_inv, rtol=2e-6, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12)
    default, one = rope.inverse_frequencies(head_dim, theta)
    assert one == 1.0 and not np.allclose(inv, default)  # the scaling changes the frequencies
    assert inv[0] == pytest.approx(default[0], rel=1e-6)  # the highest frequency is never interpolated
    s = scaling.factor
    assert inv[-1] == pytest.approx(default[-1] / s, rel=1e-6)  # the lowest is always interpolated


def test_yarn_attention_factor_is_the_papers_temperature():
    """YaRN §3.4: sqrt(1/t) = 0.1 ln(s) + 1, computed here by hand for Qwen3's factor 4."""
    scaling = rope.RopeScaling(factor=4.0, original_max_position_embeddings=32768)
    assert rope.yarn_attention_factor(scaling) == pytest.approx(1.0 + 0.1 * 1.3862943611198906, rel=1e-15)
    assert rope.yarn_attention_factor(rope.RopeScaling(factor=1.0, original_max_position_embeddings=8)) == 1.0
    assert scaling.max_positions == 131072


def test_qwen3_8b_yarn_config_reads_and_writes_config_json(tmp_path):
    """Qwen3-8B's config.json with the rope_scaling Qwen documents for 131k contexts (v4 keys) and
    transformers v5's rope_parameters give the same config; to_hf_dict round-trips through
    transformers and back."""
    from transformers import AutoConfig

    base = {**Qwen3Config.preset("8B").to_hf_dict(), "max_position_embeddings": 40960}
    v4 = Qwen3Config.from_hf_dict({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32768}})
    v5 = Qwen3Config.from_hf_dict({**{k: v for k, v in base.items() if k not in ("rope_theta", "rope_scaling")},
                                   "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                       "original_max_position_embeddings": 32768}})
    assert v4 == v5 and v4.rope_scaling == rope.RopeScaling(4.0, 32768)
    # Qwen's edit adds rope_scaling only; transformers and vLLM take max_position_embeddings as the
    # extended context, so it must be raised to use the 131,072 positions (the hint says so).
    assert "set \"max_position_embeddings\": 131072" in v4.yarn_context_hint
    assert v4.replace(max_position_embeddings=131072).yarn_context_hint == ""
    assert Qwen3Config.preset("8B").yarn_context_hint == ""
    (tmp_path / "config.json").write_text(json.dumps(v4.to_hf_dict()))
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["factor"] == 4.0
    assert Qwen3Config.from_hf_dict(hf.to_dict(), dtype=v4.dtype, remat=v4.remat) == v4


@pytest.mark.parametrize("rope_scaling,match", [
    ({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 64}, "factor must be"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 1, "beta_slow": 2},
     "beta_fast=1.0 must be greater"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "low_freq_factor": 1},
     "low_freq_factor"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -3}, "positive integer"),
    ({"rope_type": "dynamic", "factor": 4.0}, "'dynamic' is not implemented"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "no 'factor'"),
    ("yarn", "JSON object"),
])
def test_bad_rope_scaling_is_one_line_naming_the_value(rope_scaling, match):
    d = {**Qwen3Config.preset("tiny").to_hf_dict(), "rope_scaling": rope_scaling}
    with pytest.raises(ValueError, match=match) as e:
        Qwen3Config.from_hf_dict(d)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# Logits of a tiny YaRN checkpoint against transformers
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def yarn_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("yarn"))
    hf = make_tiny_hf_checkpoint(path, seed=3, rope_scaling=YARN, **TINY)
    assert json.load(open(f"{path}/config.json"))["rope_parameters"]["rope_type"] == "yarn"
    cfg, params = hf_io.load_hf_checkpoint(path, dtype="float32", remat="none")
    assert cfg.rope_scaling == rope.RopeScaling(4.0, 64) and cfg.max_position_embeddings == 256
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, T).astype(np.int32)
    with torch.no_grad():
        ref = hf(torch.tensor(tokens[None], dtype=torch.long)).logits[0].double().numpy()
    return hf, cfg, params, tokens, ref


def test_yarn_training_forward_matches_transformers_past_the_original_context(yarn_model):
    hf, cfg, params, tokens, ref = yarn_model
    pos = np.arange(T, dtype=np.int32)[None]
    fwd = jax.jit(qwen3.forward, static_argnums=1)
    ours = np.asarray(fwd(params, cfg, tokens[None], pos, np.ones((1, T), np.int32)), np.float64)[0]
    err = np.abs(ours - ref).max(-1)
    assert err[64:].max() <= 1e-4 and err.max() <= 1e-4, err.max()
    # The scaling matters at these positions: default RoPE is far from the YaRN model's logits.
    plain = np.asarray(fwd(params, cfg.replace(rope_scaling=None), tokens[None], pos, np.ones((1, T), np.int32)))[0]
    assert np.abs(plain[64:] - ref[64:]).max() > 1e-2
    # The trainer's logprobs of the next tokens equal transformers' log-softmax.
    lp = jax.jit(qwen3.logprobs, static_argnums=1)(params, cfg, tokens[None], pos, np.ones((1, T), np.int32))
    lp = np.asarray(lp[0] if isinstance(lp, tuple) else lp)
    ref_lp = ref - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ref.max(-1, keepdims=True)
    want = np.take_along_axis(ref_lp[:-1], tokens[1:, None].astype(np.int64), -1)[:, 0]
    np.testing.assert_allclose(lp.reshape(-1)[:T - 1], want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_yarn_engine_prefill_and_decode_match_transformers(yarn_model, layout):
    """The engine: a 150-token prompt prefilled (right-padded to 160), then 50 decode steps at
    positions 150..199 in the row-cache layout, each step's logits against transformers' logits
    of the whole sequence."""
    hf, cfg, params, tokens, ref = yarn_model
    ep = qwen3.engine_params(params, cfg, layout=layout)
    P, L, steps = 160, 150, T - 150
    tok, mask = np.zeros((1, P), np.int32), np.zeros((1, P), bool)
    tok[0, :L], mask[0, :L] = tokens[:L], True
    logits, pkv = jax.jit(lambda ep, t, m: qwen3.prefill(ep, cfg, t, m))(ep, tok, mask)
    np.testing.assert_allclose(np.asarray(logits[0]), ref[L - 1], atol=1e-4, rtol=0)
    decode = jax.jit(lambda ep, t, pos, m, gen, i: qwen3.decode_step(ep, cfg, t, pos, None, m, gen, i))
    gen = qwen3.row_cache(pkv, steps)
    worst = 0.0
    for t in range(steps - 1):
        out, gen = decode(ep, tokens[L + t:L + t + 1], np.array([L + t], np.int32), mask, gen, t)
        worst = max(worst, float(np.abs(np.asarray(out[0], np.float64) - ref[L + t]).max()))
    assert worst <= 1e-4, worst



def test_qwen3_yarn_at_positions_past_40960_matches_transformers(tmp_path, monkeypatch):
    """Qwen3-8B's own RoPE setting (head_dim 128, base 1e6, L = 32,768, factor 4) in a 2-layer model,
    32 tokens at positions 40,000-40,031, 100,000-100,031 and 131,040-131,071 (position ids given,
    so the sequence stays short). transformers computes the inverse frequencies in float32 and
    jaxrl rounds float64 ones once, which differ by at most one float32 ulp; at position p that is
    an angle difference of p x 6e-8 (6e-3 rad at 100,000). So the logits are compared twice: with
    transformers' own frequencies in jaxrl's forward (everything else must agree to 1e-4 at these
    positions), and as they are (the rounding alone: measured 7.6e-4 at 40,000, 2.9e-3 at 100,000,
    bounded here by 1e-2)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    qwen = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    hf = make_tiny_hf_checkpoint(str(tmp_path), seed=3, rope_scaling=qwen, rope_theta=1e6,
                                 max_position_embeddings=40960, head_dim=128)
    cfg, params = hf_io.load_hf_checkpoint(str(tmp_path), dtype="float32", remat="none")
    ref_inv, ref_factor = ROPE_INIT_FUNCTIONS["yarn"](hf.config)
    ours_inv, _ = rope.inverse_frequencies(128, 1e6, cfg.rope_scaling)
    ulp = np.spacing(np.abs(ours_inv))
    assert (np.abs(ours_inv - ref_inv.numpy()) <= ulp).all()
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, 32).astype(np.int32)[None]
    own = rope.inverse_frequencies

    def logits(start, frequencies=None):
        pos = (start + np.arange(32, dtype=np.int32))[None]
        with torch.no_grad():
            ref = hf(torch.tensor(tokens, dtype=torch.long), position_ids=torch.tensor(pos, dtype=torch.long))
        if frequencies is not None:  # eager forward: no compiled trace of the other frequencies is reused
            monkeypatch.setattr(rope, "inverse_frequencies", lambda D, theta, s=None: frequencies)
        ours = qwen3.forward(params, cfg, tokens, pos, np.ones_like(tokens))
        monkeypatch.setattr(rope, "inverse_frequencies", own)
        return np.abs(np.asarray(ours, np.float64) - ref.logits.double().numpy()).max()

    for start in (40000, 100000, 131040):
        assert logits(start, (ref_inv.numpy(), float(ref_factor))) <= 1e-4, start
        assert logits(start) <= 1e-2, start


def test_yarn_rollout_engine_greedy_tokens_and_logprobs_match_transformers(yarn_model):
    """The JAX rollout engine itself (`jaxrl.rollout.sampler.Sampler`, what the sidecar serves; its
    default weight layout for this machine): a 150-token prompt decoded greedily for 48 tokens, at
    positions 150-197 of the YaRN model (trained context 64). Each token is transformers' argmax
    given the prompt and the tokens before it, and each logprob transformers' log-softmax there
    (measured on CPU, "in_out" layout: 2.3e-6, smallest argmax margin 0.009; the same engine with
    default RoPE picks other tokens, its logprobs 1.9 off)."""
    from jaxrl.rollout.sampler import Sampler
    from jaxrl.rollout.types import SamplingParams

    hf, cfg, params, tokens, _ = yarn_model
    L, n = 150, 48
    engine = Sampler(params, cfg, max_seq_len=256, batch_buckets=(1,), prompt_buckets=(160,), new_token_buckets=(n,))
    (c,), = engine.generate([tokens[:L].tolist()], SamplingParams(max_tokens=n, greedy=True))
    assert len(c.token_ids) == n
    seq = np.array(tokens[:L].tolist() + c.token_ids, np.int64)
    with torch.no_grad():
        ref = hf(torch.tensor(seq[None])).logits[0].double().numpy()[L - 1:L - 1 + n]
    assert c.token_ids == ref.argmax(-1).tolist()
    ref_lp = ref - ref.max(-1, keepdims=True)
    ref_lp = ref_lp - np.log(np.exp(ref_lp).sum(-1, keepdims=True))
    np.testing.assert_allclose(c.logprobs, ref_lp[np.arange(n), c.token_ids], atol=1e-4, rtol=0)
