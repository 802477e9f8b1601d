"""The vLLM worker extension up to `model.load_weights`, without vLLM: a fake model runner receives
the tensors; they must equal the HF checkpoint (bf16) and hf_io's export bit for bit."""
import json
import os
import subprocess
import sys
import types

import ml_dtypes
import numpy as np
import pytest
import torch

from jaxrl.models import hf_io
from jaxrl.rollout import weight_sync as ws
from jaxrl.rollout.vllm_worker import OrbaxWeightLoader
from tests.tiny_hf import make_tiny_hf_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeModel:
    def __init__(self):
        self.received = []

    def load_weights(self, weights):
        for name, t in weights:
            self.received.append((name, t.clone()))
        return {n for n, _ in self.received}


class FakeWorker(OrbaxWeightLoader):
    def __init__(self, hf_config):
        self.model_runner = types.SimpleNamespace(model=FakeModel(),
                                                  model_config=types.SimpleNamespace(hf_config=hf_config))


def _published(tmp_path, **overrides):
    ckpt, sync = str(tmp_path / "ckpt"), str(tmp_path / "sync")
    torch_model = make_tiny_hf_checkpoint(ckpt, seed=3, **overrides)
    cfg, params = hf_io.load_hf_checkpoint(ckpt)
    stats = ws.publish(params, sync, 1)
    return torch_model, cfg, params, sync, stats.path


def _u16(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("tied", [False, True])
def test_worker_feeds_hf_tensors_equal_to_checkpoint_and_hf_io_export(tmp_path, monkeypatch, tied):
    torch_model, cfg, params, sync, path = _published(tmp_path, tie_word_embeddings=tied)
    monkeypatch.setenv("JAXRL_SYNC_DIR", sync)
    worker = FakeWorker(torch_model.config)
    info = worker.load_orbax_version(path, "1")
    assert info["policy_version"] == 1 and worker.jaxrl_version() == 1
    received = worker.model_runner.model.received
    # 1) hf_io's export of the same (bf16) params: same names, order, values bit for bit.
    bf16 = {k: v for k, v in hf_io.params_to_hf_tensors(params, cfg, dtype="bfloat16")}
    assert [n for n, _ in received] == list(bf16)
    for name, t in received:
        assert t.dtype == torch.bfloat16 and t.device.type == "cpu"
        np.testing.assert_array_equal(_u16(t), bf16[name].view(np.uint16), err_msg=name)
    # 2) independently: the HF model's own tensors rounded to bf16 by torch.
    state = torch_model.state_dict()
    expected_names = set(state) - ({"lm_head.weight"} if tied else set())
    assert {n for n, _ in received} == expected_names
    for name, t in received:
        np.testing.assert_array_equal(_u16(t), _u16(state[name].to(torch.bfloat16)), err_msg=name)
    assert info["tensors"] == len(expected_names)


def test_worker_refuses_paths_outside_sync_dir_and_wrong_versions(tmp_path, monkeypatch):
    torch_model, cfg, params, sync, path = _published(tmp_path)
    worker = FakeWorker(torch_model.config)
    monkeypatch.delenv("JAXRL_SYNC_DIR", raising=False)
    with pytest.raises(PermissionError, match="JAXRL_SYNC_DIR"):
        worker.load_orbax_version(path)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("JAXRL_SYNC_DIR", str(other))
    with pytest.raises(PermissionError, match="sync directory"):
        worker.load_orbax_version(path)
    monkeypatch.setenv("JAXRL_SYNC_DIR", sync)
    with pytest.raises(PermissionError):
        worker.load_orbax_version(os.path.join(sync, "1", "..", "..", "ckpt"))
    with pytest.raises(ValueError, match="does not match"):
        worker.load_orbax_version(path, "2")
    assert worker.model_runner.model.received == []


def test_worker_module_never_imports_jax(tmp_path):
    torch_model, cfg, params, sync, path = _published(tmp_path)
    code = f"""
import json, sys, types
from jaxrl.rollout.vllm_worker import OrbaxWeightLoader
class Cfg:
    def to_dict(self):
        return json.load(open({str(tmp_path / 'ckpt' / 'config.json')!r}))
class Model:
    n = 0
    def load_weights(self, weights):
        for name, t in weights:
            Model.n += 1
class W(OrbaxWeightLoader):
    model_runner = types.SimpleNamespace(model=Model(), model_config=types.SimpleNamespace(hf_config=Cfg()))
info = W().load_orbax_version({path!r}, "1")
print(json.dumps({{"jax": "jax" in sys.modules, "tensors": Model.n, "version": info["policy_version"]}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env["JAXRL_SYNC_DIR"] = sync
    env["PYTHONPATH"] = REPO
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"jax": False, "tensors": len(torch_model.state_dict()), "version": 1}


@pytest.mark.parametrize("tied,rope_scaling", [(False, None), (True, None),
                                               (False, {"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 8})])
def test_load_probe_reference_equals_transformers_in_float64(tmp_path, tied, rope_scaling):
    """weight_probe.reference_logprobs (NumPy float64, read from a published version) against
    transformers' Qwen3ForCausalLM in float64 on the same float32 weights: tied and untied heads, GQA,
    and YaRN (short original context, so the probe's positions pass it)."""
    from jaxrl.rollout import weight_probe

    ckpt = str(tmp_path / "ckpt")
    extra = {"rope_scaling": rope_scaling, "max_position_embeddings": 32} if rope_scaling else {}
    model = make_tiny_hf_checkpoint(ckpt, seed=5, tie_word_embeddings=tied, **extra).double()
    cfg, params = hf_io.load_hf_checkpoint(ckpt)
    ws.publish(params, str(tmp_path / "sync"), 1, dtype="float32")
    tokens = weight_probe.probe_tokens(cfg.vocab_size)
    assert tokens == weight_probe.probe_tokens(cfg.vocab_size) and len(tokens) == weight_probe.PROBE_LEN
    ref = weight_probe.reference_logprobs(ws.version_path(str(tmp_path / "sync"), 1), cfg, tokens)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([tokens])).logits[0], -1)
    want = lp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].numpy()
    assert ref.dtype == np.float64 and ref.shape == (len(tokens) - 1,)
    assert np.abs(ref - want).max() < 1e-6  # float32-rounded RoPE frequencies, as transformers has them


def test_load_probe_names_a_missing_tensor(tmp_path):
    from jaxrl.rollout import weight_probe

    ckpt = str(tmp_path / "ckpt")
    make_tiny_hf_checkpoint(ckpt, seed=5, tie_word_embeddings=True)
    cfg, params = hf_io.load_hf_checkpoint(ckpt)
    ws.publish(params, str(tmp_path / "sync"), 1, dtype="float32")
    untied = hf_io.Qwen3Config.from_hf_dict({**json.load(open(os.path.join(ckpt, "config.json"))),
                                             "tie_word_embeddings": False})
    with pytest.raises(KeyError, match="lacks.*lm_head"):
        weight_probe.reference_logprobs(ws.version_path(str(tmp_path / "sync"), 1), untied, [1, 2, 3])
