"""Invalid configs fail before any work starts, naming the key and the fix."""
import json
import os
import sys

import shutil

import pytest

from config_helpers import set_key
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
    # The seed runs think and keep past <think> blocks (qwen3_thinking_acc.jinja2); the CPU scale does not.
    assert (big.generator.enable_thinking, big.generator.chat_template) == (True, "keep_thinking")
    assert (c.generator.enable_thinking, c.generator.chat_template) == (False, "")
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
    ("generator.sampling_params.temperature", 0.001, "must be finite and >= 0.01"),
    ("generator.eval_sampling_params.temperature", 0.0, "must be finite and >= 0.01"),
    ("model.path", "/nonexistent/ckpt", "'/nonexistent/ckpt' does not exist"),
])
def test_invalid_values_name_the_key_and_the_fix(key, value, match):
    c = set_key(rloo.get_config(), key, value)
    with pytest.raises(ConfigError, match=match) as e:
        validate(c)
    assert e.value.key == key and "Fix:" in str(e.value)


def test_batch_size_mismatches_name_both_keys_in_the_fix():
    """Regression (fresh-user review): train_batch_size=7 was blamed on mini_batch_size with "use a
    divisor of 7", and n_samples_per_prompt=1 on micro_batch_size, naming neither key set."""
    c = set_key(rloo.get_config(), "trainer.train_batch_size", 7)
    with pytest.raises(ConfigError) as e:
        validate(c)
    assert "set trainer.mini_batch_size to a divisor of 7" in str(e.value)
    assert f"or trainer.train_batch_size to a multiple of {c.trainer.mini_batch_size}" in str(e.value)
    c = set_key(rloo.get_config(), "generator.n_samples_per_prompt", 1)
    c.trainer.algorithm.advantage_estimator = "grpo"  # (rloo_n refuses one sample per prompt before this check)
    with pytest.raises(ConfigError) as e:
        validate(c)
    assert "change mini_batch_size or generator.n_samples_per_prompt" in str(e.value), str(e.value)


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


def test_model_path_with_damaged_files_is_refused_up_front(tmp_path):
    """Regression (fresh-user review): a truncated model.safetensors or config.json that is not
    JSON reached the loaders (a traceback), and a folder without tokenizer.json trained on prompts
    encoded to nothing (0% success, no error). Each is now one ConfigError naming model.path."""
    ckpt = tmp_path / "policy"
    shutil.copytree(DEFAULT_POLICY_DIR, ckpt)
    c = rloo.get_config()
    c.model.path = str(ckpt)
    validate(c)  # the intact copy passes
    cases = []
    (ckpt / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    cases.append(("has no tokenizer files (tokenizer.json, or vocab.json + merges.txt)", "copy the tokenizer files"))
    with pytest.raises(ConfigError) as e:
        validate(c)
    (tmp_path / "tokenizer.json").rename(ckpt / "tokenizer.json")
    errors = [e.value]
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:5000])
    cases.append((f"{str(weights)!r} is not a readable safetensors file (", "point it at"))
    with pytest.raises(ConfigError) as e:
        validate(c)
    weights.write_bytes(data)
    errors.append(e.value)
    config = ckpt / "config.json"
    text = config.read_text()
    config.write_text('{"bad":\n')
    cases.append((f"{str(config)!r} is not valid JSON (Expecting value at line 2, column 1)", "point it at"))
    with pytest.raises(ConfigError) as e:
        validate(c)
    config.write_text(text)
    errors.append(e.value)
    for err, (problem, fix) in zip(errors, cases):
        assert err.key == "model.path" and problem in str(err) and fix in str(err), str(err)
        assert len(str(err).splitlines()) == 1, str(err)
    validate(c)  # restored


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
    # Regression: a generation budget beyond the model's context reached the sidecar (OOM there).
    c = rloo.get_config()
    c.model.path = ckpt  # max_position_embeddings 512
    c.generator.sampling_params.max_generate_length = 1000
    c.trainer.seq_len_buckets = (2048,)
    with pytest.raises(ConfigError, match="max_position_embeddings=512") as e:
        trainer.Trainer(c, str(workdir))
    assert e.value.key == "generator.sampling_params.max_generate_length"
    assert not workdir.exists()
    # keep_thinking on a checkpoint whose chat template is not Qwen3's: one line naming the key.
    c = rloo.get_config()
    plain = str(tmp_path / "plain_template")
    shutil.copytree(ckpt, plain)
    tc = json.load(open(os.path.join(plain, "tokenizer_config.json")))
    tc["chat_template"] = "{% for m in messages %}{{ m.content }}<|im_end|>{% endfor %}"
    json.dump(tc, open(os.path.join(plain, "tokenizer_config.json"), "w"))
    c.model.path, c.generator.chat_template = plain, "keep_thinking"
    with pytest.raises(ConfigError, match="not Qwen3's") as e:
        trainer.Trainer(c, str(workdir))
    assert e.value.key == "generator.chat_template" and not workdir.exists()
    c.model.path = ckpt
    # YaRN (issue 23): a config.json that adds only rope_scaling (factor 4 over 512 positions) is
    # told how to use the 2,048 positions; with max_position_embeddings 2048, 1,000 new tokens fit.
    yarn = str(tmp_path / "yarn_policy")
    make_tiny_hf_checkpoint(yarn, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 512})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(DEFAULT_POLICY_DIR, name), yarn)
    c.model.path = yarn
    c.generator.sampling_params.max_generate_length = 1000
    c.trainer.seq_len_buckets = (4096,)
    with pytest.raises(ConfigError, match="covers 2048 positions: set \"max_position_embeddings\": 2048") as e:
        trainer.Trainer(c, str(workdir))
    assert not workdir.exists()
    cfg = json.load(open(os.path.join(yarn, "config.json")))
    json.dump({**cfg, "max_position_embeddings": 2048}, open(os.path.join(yarn, "config.json"), "w"))
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 8  # past the context check, the mesh check refuses
    c.trainer.micro_batch_size = 8
    with pytest.raises(ConfigError, match="mesh"):
        trainer.Trainer(c, str(workdir))
    assert not workdir.exists()


@pytest.mark.parametrize("key,value,match", [
    ("generator.num_sidecars", 0, "must be >= 1"),
    ("generator.sampling_params.top_k", -5, "not a valid top-k"),
    ("trainer.collapse.max_rollbacks", -1, "must be >= 0"),
    ("data.num_eval_prompts", -1, "must be >= 0"),
    ("trainer.seq_len_buckets", (16,), "add a bucket >= 144"),
    ("data.task", "nosuch", "unknown task 'nosuch'"),
    ("data.eval_task", "nosuch", "unknown task 'nosuch'"),
    ("generator.chat_template", "keep_thoughts", "unknown value 'keep_thoughts'"),
])
def test_review_found_values_are_rejected_up_front(key, value, match):
    """Regression: these were accepted and failed (or silently ran) after the run directory existed."""
    c = set_key(rloo.get_config(), key, value)
    with pytest.raises(ConfigError, match=match) as e:
        validate(c)
    assert e.value.key == key


def test_micro_batch_must_split_over_the_data_axes_of_the_mesh():
    """Regression: the 8B recipe's micro-batch did not divide the 2-node mesh of the launch script."""
    c = rloo.get_config("qwen3_8b")
    validate(c, num_devices=8, check_inputs=False)  # 2 GH200 nodes: data=-1 -> 1, fsdp=8: 8 rows
    with pytest.raises(ConfigError, match="do not split over data x fsdp = 16") as e:
        validate(c, num_devices=16, check_inputs=False)  # 8 rows do not split over 16 devices
    assert e.value.key == "trainer.micro_batch_size"


def test_symclip_cpu_scale_string_equals_the_default():
    """Regression: `configs/symclip.py:cpu` used the 8B max_seq_len."""
    assert symclip.get_config("cpu").trainer.algorithm.max_seq_len == symclip.get_config().trainer.algorithm.max_seq_len


def test_config_error_accepts_a_single_message():
    """Regression: ml_collections re-raises a recipe's exception as type(e)(message)."""
    e = ConfigError("config key `x`: bad. Fix: y")
    assert str(e) == "config key `x`: bad. Fix: y"


def test_chat_template_dependency_is_declared():
    """Regression: transformers' apply_chat_template needs jinja2, which only the dev extra pulled in."""
    import re

    setup = open(os.path.join(ROOT, "setup.py")).read()
    install_requires = setup[setup.index("install_requires"):setup.index("extras_require")]
    assert re.search(r'"jinja2[>=<]', install_requires)


@pytest.mark.parametrize("args,match", [
    (["--config=configs/rloo.py", "--config.trainer.lr=1"], "unknown config key"),
    (["--config=configs/rloo.py:foo"], "unknown scale 'foo'"),
    (["--config=configs/nope.py"], "could not be loaded"),
    (["--config=configs/rloo.py", "--config.trainer.algorithm.loss_reduction=foo"], "loss_reduction"),
])
def test_cli_usage_errors_are_one_line_and_write_nothing(tmp_path, args, match):
    import subprocess

    wd = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-m", "jaxrl.main", *args, f"--workdir={wd}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert match in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not wd.exists()


def test_dataset_prompts_follow_one_permutation_per_epoch(tmp_path):
    """Regression: a batch crossing an epoch boundary wrapped around the old epoch's permutation."""
    import json as _json

    path = tmp_path / "tasks.jsonl"
    with open(path, "w") as f:
        for i in range(10):
            f.write(_json.dumps({"id": f"t{i}", "prompt": f"What is {i} + 1?",
                                 "reward_spec": {"type": "exact_match", "answer": str(i + 1)}}) + "\n")
    c = rloo.get_config()
    c.data.task, c.data.dataset_path = "dataset", str(path)
    c.data.eval_fraction = 0  # every row trains
    c.trainer.train_batch_size = 4
    src = trainer.PromptSource(c)
    served = [t.task_id for step in range(1, 11) for t in src.train_batch(step)]  # 40 prompts = 4 epochs
    for epoch in range(4):
        assert sorted(served[10 * epoch:10 * (epoch + 1)]) == sorted(f"t{i}" for i in range(10))
    assert served[:10] != served[10:20]  # reshuffled each epoch


@pytest.mark.parametrize("key,value,match", [
    ("trainer.algorithm.temperature", 0.6, "differs from generator.sampling_params.temperature=1.0"),
    ("data.dataset_path", "/some/tasks.jsonl", "data.task='arithmetic' does not read it"),
    ("trainer.success_threshold", float("nan"), "not finite"),
    ("trainer.logprob_diff_warn_threshold", -0.5, "is not a bound"),
])
def test_issue9_silent_mismatches_are_config_errors(key, value, match):
    """Regression (issue 9 §1, §7): a trainer temperature other than the sampling temperature
    (0.6 vs 1.0 put the ratio in 0.62-2.25 at equal weights) and a dataset path that the
    built-in task ignores were accepted silently."""
    c = set_key(rloo.get_config(), key, value)
    with pytest.raises(ConfigError, match=match) as e:
        validate(c)
    assert e.value.key == key and "Fix:" in str(e.value)


def test_temperature_mismatch_needs_the_explicit_opt_in():
    c = set_key(rloo.get_config(), "trainer.algorithm.temperature", 0.6)
    c.trainer.algorithm.allow_temperature_mismatch = True
    validate(c)
    with pytest.raises(ConfigError, match="allow_temperature_mismatch=True"):
        validate(set_key(rloo.get_config(), "generator.sampling_params.temperature", 0.7))


def test_more_eval_prompts_than_the_eval_split_is_a_config_error():
    """Regression (fresh-user review): num_eval_prompts above the built-in eval split's size (the
    arithmetic eval split holds 1441 problems, counted here from the task itself) passed validation
    and crashed at the first evaluation with a traceback, after the run directory was written."""
    from jaxrl.envs import get_task_suite

    size = len(get_task_suite("arithmetic").dataset("eval"))
    assert len(trainer.PromptSource(set_key(rloo.get_config(), "data.num_eval_prompts", size)).eval_batch()) == size
    with pytest.raises(ConfigError, match=f"1..{size}") as e:
        trainer.PromptSource(set_key(rloo.get_config(), "data.num_eval_prompts", size + 1))
    assert e.value.key == "data.num_eval_prompts" and "Fix:" in str(e.value)


def test_zero_eval_prompts_means_no_eval_tasks():
    """Regression (issue 9 §7): num_eval_prompts=0 ("0 skips evaluation") crashed in the task's
    dataset call."""
    c = set_key(rloo.get_config(), "data.num_eval_prompts", 0)
    validate(c)
    assert trainer.PromptSource(c).eval_batch() == []
    assert len(trainer.PromptSource(set_key(rloo.get_config(), "data.num_eval_prompts", 3)).eval_batch()) == 3


@pytest.mark.parametrize("content,match", [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary", "is not text"),
    (b'{"seed": 0, "trainer": ', "is not valid JSON"),
    (b'[1, 2, 3]', "must be a JSON object, found a JSON list"),
])
def test_garbage_rl_config_json_is_one_line_naming_the_file(tmp_path, content, match):
    """Regression (issue 9 §8): garbage in a run's rl_config.json gave a traceback that did not
    name the file."""
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "rl_config.json").write_bytes(content)
    with pytest.raises(trainer.RunDirError, match=match) as e:
        trainer.Trainer(rloo.get_config(), str(wd))
    msg = str(e.value)
    assert str(wd / "rl_config.json") in msg and "Fix:" in msg and "\n" not in msg
    assert (wd / "rl_config.json").read_bytes() == content  # left as it was


def test_garbage_rl_config_json_on_the_command_line(tmp_path):
    import subprocess

    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "rl_config.json").write_bytes(b"\x00\x01garbage")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-m", "jaxrl.main", "--config=configs/rloo.py", f"--workdir={wd}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {wd / 'rl_config.json'}: ")


def test_sidecar_errors_shown_to_cli_users_name_no_python_api():
    """Regression (issue 9 §8): the CLI error of a failed weight load told the user to call
    `SidecarProcess.restart()`."""
    from jaxrl.rollout.client import SidecarError
    from jaxrl.train.trainer import sidecar_error_text

    e = SidecarError("http://127.0.0.1:9", "POST /v1/load_weights failed after 3 attempts (is the sidecar process "
                     "alive? restart it with SidecarProcess.restart()): http://127.0.0.1:9: ConnectError: refused")
    text = sidecar_error_text(e)
    assert "SidecarProcess" not in text and "()" not in text
    assert text == ("sidecar http://127.0.0.1:9: POST /v1/load_weights failed after 3 attempts: "
                    "http://127.0.0.1:9: ConnectError: refused")


@pytest.mark.parametrize("content,match", [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary", "the run summary is not text"),
    (b'{"best_step": 3, ', "the run summary is not valid JSON"),
    (b'"done"', "the run summary must be a JSON object, found a JSON str"),
])
def test_garbage_summary_json_is_one_warning_line_naming_the_file(tmp_path, capsys, content, match):
    """Issue 9 §8: summary.json is read by the same reader as rl_config.json; garbage in it gives
    one warning line naming the file (the finished run is then finished again, rewriting it)."""
    from jaxrl.train.rundir import read_finished_summary

    path = tmp_path / "summary.json"
    path.write_bytes(content)
    assert read_finished_summary(str(path)) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"jaxrl: warning: {path}: {match}")
    assert err.endswith("; finishing the run again to rewrite it\n")
    assert path.read_bytes() == content  # left as it was
    path.write_text('{"best_step": 3, "last_step": 10}')
    assert read_finished_summary(str(path)) == {"best_step": 3, "last_step": 10}
    assert capsys.readouterr().err == ""
