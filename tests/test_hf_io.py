"""HF safetensors <-> params: bit-exact round trips, tied embeddings, errors, no-JAX import."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from jaxrl import parallel
from jaxrl.models import hf_io, qwen3
from tiny_hf import make_tiny_hf_checkpoint


def _all_tensors(path):
    """{name: numpy array} of every safetensors file in a directory."""
    out = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, fn)))
    return out


def _logits(model, toks):
    with torch.no_grad():
        return model(torch.tensor(toks, dtype=torch.long)).logits.float().numpy()


TOKS = np.random.default_rng(0).integers(0, 256, (2, 12))


@pytest.mark.parametrize("dtype,shard", [("float32", None), ("bfloat16", "40KB"), ("float32", "60KB")])
def test_round_trip_is_bit_exact_and_export_loads_in_transformers(tmp_path, dtype, shard):
    from transformers import AutoModelForCausalLM

    src, out = tmp_path / "src", tmp_path / "out"
    hf = make_tiny_hf_checkpoint(str(src), seed=2, dtype=dtype)
    if shard:  # re-save as a sharded checkpoint with an index
        for fn in os.listdir(src):
            if fn.endswith(".safetensors"):
                os.remove(src / fn)
        hf.save_pretrained(str(src), max_shard_size=shard)
        assert (src / hf_io.SAFE_INDEX).exists()
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    cfg, params = hf_io.load_hf_checkpoint(str(src), dtype="float32")
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    files = hf_io.save_hf_checkpoint(params, cfg, str(out), dtype=dtype, max_shard_bytes=50_000,
                                     tokenizer_dir=str(src))
    assert hf_io.SAFE_INDEX in files and "tokenizer_config.json" in files
    a, b = _all_tensors(src), _all_tensors(out)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name
    # Compare fresh loads (a model cast with .to(bf16) also rounds its RoPE inv_freq buffer).
    load = lambda p: AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32)  # noqa: E731
    np.testing.assert_array_equal(_logits(load(out), TOKS), _logits(load(src), TOKS))


def test_tied_checkpoint_with_and_without_stored_lm_head(tmp_path):
    hf = make_tiny_hf_checkpoint(str(tmp_path / "a"), seed=3, tie_word_embeddings=True)
    t = _all_tensors(tmp_path / "a")
    assert "lm_head.weight" not in t  # transformers omits the tied head
    cfg, p1 = hf_io.load_hf_checkpoint(str(tmp_path / "a"), dtype="float32")
    os.makedirs(tmp_path / "b")
    os.replace(tmp_path / "a" / "config.json", tmp_path / "b" / "config.json")
    save_file({**t, "lm_head.weight": t["model.embed_tokens.weight"]}, str(tmp_path / "b" / "model.safetensors"))
    cfg2, p2 = hf_io.load_hf_checkpoint(str(tmp_path / "b"), dtype="float32")
    assert cfg.tie_word_embeddings and "lm_head" not in p1 and "lm_head" not in p2
    toks = TOKS.astype(np.int32)
    pos = np.tile(np.arange(12, dtype=np.int32), (2, 1))
    ours = np.asarray(qwen3.forward(p2, cfg2, toks, pos, np.ones_like(toks)))
    assert np.abs(ours - _logits(hf, TOKS)).max() <= 1e-4
    names = [n for n, _ in hf_io.params_to_hf_tensors(p1, cfg)]
    assert "lm_head.weight" not in names and len(names) == len(t)


def test_untied_config_without_lm_head_is_an_error(tmp_path):
    make_tiny_hf_checkpoint(str(tmp_path), seed=4, tie_word_embeddings=False)
    t = _all_tensors(tmp_path)
    del t["lm_head.weight"]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tie_word_embeddings=false.*lm_head\.weight"):
        hf_io.load_hf_checkpoint(str(tmp_path))


def test_shape_mismatch_and_unexpected_tensors_are_named(tmp_path):
    make_tiny_hf_checkpoint(str(tmp_path), seed=5)  # intermediate_size 128, hidden 64
    t = _all_tensors(tmp_path)
    t["model.layers.1.mlp.up_proj.weight"] = np.zeros((96, 64), np.float32)
    t["model.layers.7.mlp.up_proj.weight"] = np.zeros((128, 64), np.float32)
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        hf_io.load_hf_checkpoint(str(tmp_path))
    msg = str(e.value)
    assert "model.layers.1.mlp.up_proj.weight" in msg and "(96, 64)" in msg and "(128, 64)" in msg
    assert "unexpected" in msg and "model.layers.7.mlp.up_proj.weight" in msg


def test_sharded_load_equals_single_device_load(tmp_path):
    make_tiny_hf_checkpoint(str(tmp_path), seed=6)
    cfg, ref = hf_io.load_hf_checkpoint(str(tmp_path))
    mesh = parallel.make_mesh(2, 2, 2)
    sh = parallel.param_shardings(qwen3.param_logical_axes(cfg), mesh, ref)
    _, params = hf_io.load_hf_checkpoint(str(tmp_path), cfg, shardings=sh)
    for a, b, s in zip(jax.tree.leaves(params), jax.tree.leaves(ref), jax.tree.leaves(sh)):
        assert a.sharding == s
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert params["layers"]["q_proj"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)


def test_hf_io_needs_no_jax_and_converts_numpy_params(tmp_path):
    """The vLLM worker imports hf_io without JAX and converts numpy params."""
    make_tiny_hf_checkpoint(str(tmp_path), seed=7)
    code = f"""
import sys, numpy as np
from safetensors.numpy import load_file
import jaxrl.models, jaxrl.models.hf_io as h
cfg = h.Qwen3Config.from_pretrained({str(tmp_path)!r})
src = load_file({str(tmp_path / 'model.safetensors')!r})
params = {{}}
for m in h.mapping_for(cfg):
    arrs = [h.hf_to_ours(m, src[n], cfg) for n in h.hf_names(m, cfg)]
    x = np.stack(arrs) if m.stacked else arrs[0]
    d2 = params
    for k in m.path[:-1]:
        d2 = d2.setdefault(k, {{}})
    d2[m.path[-1]] = x
out = dict(h.params_to_hf_tensors(params, cfg, dtype='bfloat16'))
assert sorted(out) == sorted(src)
for n in src:
    assert out[n].dtype.name == 'bfloat16'
    assert np.array_equal(out[n].astype(np.float32), src[n].astype('bfloat16').astype(np.float32)), n
assert 'jax' not in sys.modules, 'hf_io imported jax'
print('ok')
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_tied_config_with_a_different_stored_head_is_an_error_naming_both_fixes(tmp_path):
    """Issue 9 §7: transformers unties and uses a stored head that differs from the embedding; loading it
    silently as tied would give other logits. Error, then each documented fix loads what it says."""
    from transformers import AutoModelForCausalLM

    tied = make_tiny_hf_checkpoint(str(tmp_path / "a"), seed=3, tie_word_embeddings=True)
    t = _all_tensors(tmp_path / "a")
    head = 0.08 * np.random.default_rng(0).standard_normal(t["model.embed_tokens.weight"].shape).astype(np.float32)
    ckpt = tmp_path / "b"
    os.makedirs(ckpt)
    cfg_json = json.loads((tmp_path / "a" / "config.json").read_text())
    tensors = {**t, "lm_head.weight": head}
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    (ckpt / "config.json").write_text(json.dumps(cfg_json))
    with pytest.raises(ValueError, match=r"tie_word_embeddings=true but the checkpoint stores an lm_head\.weight "
                                         r"that differs from model\.embed_tokens\.weight") as e:
        hf_io.load_hf_checkpoint(str(ckpt), dtype="float32")
    assert '"tie_word_embeddings": false' in str(e.value) and "delete lm_head.weight" in str(e.value)
    # What transformers does with it: the stored head, logits far from the tied model's.
    untied_hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    assert np.abs(_logits(untied_hf, TOKS) - _logits(tied, TOKS)).max() > 1.0
    toks, pos = TOKS.astype(np.int32), np.tile(np.arange(12, dtype=np.int32), (2, 1))

    # Fix 1: untie in config.json -> our model uses the stored head, as transformers does.
    (ckpt / "config.json").write_text(json.dumps({**cfg_json, "tie_word_embeddings": False}))
    cfg, params = hf_io.load_hf_checkpoint(str(ckpt), dtype="float32")
    np.testing.assert_array_equal(np.asarray(params["lm_head"]), head.T)
    ours = np.asarray(qwen3.forward(params, cfg, toks, pos, np.ones_like(toks)))
    assert np.abs(ours - _logits(untied_hf, TOKS)).max() <= 1e-4

    # Fix 2: drop the stored head -> tied to the embedding (the transformers tied model).
    del tensors["lm_head.weight"]
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    (ckpt / "config.json").write_text(json.dumps(cfg_json))
    cfg, params = hf_io.load_hf_checkpoint(str(ckpt), dtype="float32")
    ours = np.asarray(qwen3.forward(params, cfg, toks, pos, np.ones_like(toks)))
    assert "lm_head" not in params and np.abs(ours - _logits(tied, TOKS)).max() <= 1e-4


def test_tied_bf16_checkpoint_with_an_equal_stored_head_loads(tmp_path):
    hf = make_tiny_hf_checkpoint(str(tmp_path), seed=9, tie_word_embeddings=True, dtype="bfloat16")
    t = _all_tensors(tmp_path)
    assert t["model.embed_tokens.weight"].dtype.name == "bfloat16"
    save_file({**t, "lm_head.weight": t["model.embed_tokens.weight"].copy()}, str(tmp_path / "model.safetensors"))
    cfg, params = hf_io.load_hf_checkpoint(str(tmp_path), dtype="float32")
    assert cfg.tie_word_embeddings and "lm_head" not in params
    np.testing.assert_array_equal(np.asarray(params["embed_tokens"]),
                                  hf.model.embed_tokens.weight.detach().float().numpy())


def test_non_finite_weights_are_named(tmp_path):
    make_tiny_hf_checkpoint(str(tmp_path), seed=8)
    t = _all_tensors(tmp_path)
    t["model.layers.1.self_attn.k_proj.weight"][3, 5] = np.nan
    t["model.layers.1.self_attn.k_proj.weight"][0, 0] = np.inf
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor model\.layers\.1\.self_attn\.k_proj\.weight holds 2 NaN/inf"):
        hf_io.load_hf_checkpoint(str(tmp_path), dtype="float32")
