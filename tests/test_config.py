"""Invalid configs fail before any work starts, naming the key and the fix."""
import os
import sys

import shutil

import pytest

from jaxrl.config import ConfigError, validate
from jaxrl.envs import DEFAULT_POLICY_DIR
from jaxrl.train import trainer
from tiny_hf import make_tiny_hf_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))
import grpo  # noqa: E402
import rloo  # noqa: E402
import seqmean  # noqa: E402
import symclip  # noqa: E402


def test_recipes_hold_the_published_settings():
    c = rloo.get_config()
    a = c.trainer.algorithm
    assert (a.advantage_estimator, a.policy_loss_type, a.loss_reduction) == ("rloo_n", "regular", "token_mean")
    assert (a.eps_clip_low, a.eps_clip_high, a.kl_loss_coef) == (0.2, 0.05, 0.0)
    assert (c.trainer.train_batch_size, c.generator.n_samples_per_prompt) == (64, 8)
    assert c.trainer.optimizer.max_grad_norm == 0.9
    big = rloo.get_config("qwen3_8b")
    assert big.trainer.optimizer.lr == 8e-6 and big.generator.backend == "vllm"
    assert big.trainer.algorithm.max_seq_len == 32768
    assert seqmean.get_config().trainer.algorithm.loss_reduction == "sequence_mean"
    s = symclip.get_config().trainer.algorithm
    assert (s.eps_clip_low, s.eps_clip_high, s.loss_reduction) == (0.2, 0.2, "seq_mean_token_sum_norm")
    assert s.max_seq_len > 0 and s.off_policy_correction.tis_ratio_type == "token"
    assert s.off_policy_correction.token_tis_ratio_clip_high == 2.0
    assert grpo.get_config().trainer.algorithm.advantage_estimator == "grpo"
    for c in (rloo.get_config(), seqmean.get_config(), symclip.get_config(), grpo.get_config()):
        validate(c)
    with pytest.raises(ConfigError, match="unknown scale"):
        rloo.get_config("qwen3_9b")


@pytest.mark.parametrize("key,value,match", [
    ("trainer.algorithm.policy_loss_type", "ppo_v9", "unknown name 'ppo_v9'"),
    ("trainer.algorithm.loss_reduction", "mean", "unknown name 'mean'"),
    ("trainer.algorithm.eps_clip_low", 1.5, "outside"),
    ("trainer.algorithm.eps_clip_high", -0.1, "outside"),
    ("trainer.mini_batch_size", 48, "not a multiple of mini_batch_size=48"),
    ("trainer.micro_batch_size", 100, "not a multiple of micro_batch_size=100"),
    ("trainer.optimizer.lr", -1.0, "positive"),
    ("generator.sampling_params.top_p", 0.0, "in \\(0, 1\\]"),
    ("model.path", "/nonexistent/ckpt", "not an HF checkpoint"),
])
def test_invalid_values_name_the_key_and_the_fix(key, value, match):
    c = rloo.get_config()
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(ConfigError, match=match) as e:
        validate(c)
    assert e.value.key == key and "Fix:" in str(e.value)


def test_seq_mean_token_sum_norm_requires_max_seq_len():
    c = rloo.get_config()
    c.trainer.algorithm.loss_reduction = "seq_mean_token_sum_norm"
    with pytest.raises(ConfigError, match="trainer.algorithm.max_seq_len"):
        validate(c)
    c.trainer.algorithm.loss_reduction = "seq_mean_token_sum_norm_global"
    with pytest.raises(ConfigError, match="trainer.algorithm.max_seq_len"):
        validate(c)


def test_8b_scale_requires_a_checkpoint_path():
    with pytest.raises(ConfigError, match="model.path") as e:
        validate(rloo.get_config("qwen3_8b"))
    assert "Qwen3-8B" in str(e.value)


def test_trainer_rejects_bad_config_before_writing_anything(tmp_path):
    ckpt = str(tmp_path / "policy")
    make_tiny_hf_checkpoint(ckpt)  # 4 query heads, 2 KV heads
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(DEFAULT_POLICY_DIR, name), ckpt)
    c = rloo.get_config()
    c.model.path = ckpt
    c.trainer.algorithm.loss_reduction = "nope"
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match="loss_reduction"):
        trainer.Trainer(c, str(workdir))
    assert not workdir.exists()
    # A mesh that does not divide the model: tensor=8 cannot split 2 KV heads.
    c = rloo.get_config()
    c.model.path = ckpt
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 8
    c.trainer.micro_batch_size = 8
    with pytest.raises(ConfigError, match="mesh") as e:
        trainer.Trainer(c, str(workdir))
    assert "kv_heads" in str(e.value) or "heads" in str(e.value)
    assert not workdir.exists()
