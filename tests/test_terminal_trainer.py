"""The main job on Harbor terminal tasks (configs/terminal.py cut to 2 tiny steps): one trial_stats.csv
row per trial with its outcome, outcome metrics, readable episodes in rollouts/, the verifier gate
excluding a planted inverted-verifier task, and the config keys of Harbor runs."""
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from harbor_helpers import write_task_dir
from config_helpers import set_key
from jaxrl.config import ConfigError, validate
from jaxrl.envs.harbor import SHIPPED_TASKS_DIR, Outcome

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_KILL_AT")},
       "JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false"}
sys.path.insert(0, os.path.join(ROOT, "configs"))
import terminal  # noqa: E402

TINY = ["--config.trainer.num_steps=2", "--config.trainer.train_batch_size=3", "--config.trainer.mini_batch_size=3",
        "--config.trainer.micro_batch_size=6", "--config.generator.n_samples_per_prompt=2",
        "--config.data.num_eval_prompts=2", "--config.trainer.eval_interval=0", "--config.harbor.concurrency=8"]


def _main(workdir, *overrides, timeout=600):
    cmd = [sys.executable, "-m", "jaxrl.main", "--config=configs/terminal.py", f"--workdir={workdir}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_two_steps_on_terminal_tasks_with_the_verifier_gate(tmp_path):
    # A task folder: 4 shipped write-file tasks + a planted inverted verifier (pays 1 for an empty /app).
    data = tmp_path / "tasks"
    for i in range(4):
        shutil.copytree(SHIPPED_TASKS_DIR / f"write-file-00{i}", data / f"write-file-00{i}")
    inverted = ('#!/bin/bash\nif [ -f /app/done.txt ]; then echo 0 > /logs/verifier/reward.txt; '
                'else echo 1 > /logs/verifier/reward.txt; fi\n')
    write_task_dir(data, "inverted", test_sh=inverted)
    held = tmp_path / "held"
    for i in (6, 7):
        shutil.copytree(SHIPPED_TASKS_DIR / f"write-file-00{i}", held / f"write-file-00{i}")
    wd = tmp_path / "run"
    out = _main(wd, *TINY, f"--config.data.dataset_path={data}", f"--config.data.eval_dataset_path={held}",
                "--config.data.verify_tasks=True")
    assert out.returncode == 0, out.stderr[-4000:]
    (line,) = [x for x in out.stderr.splitlines() if "excluded by the verifier sanity gate" in x]
    # the inverted verifier fails both ways: 0 for the oracle's done.txt, 1 for an empty /app
    assert line.startswith("jaxrl: task test/inverted excluded") and "empty agent: reward 1" in line, line
    assert "oracle: reward 0" in line, line
    gate = json.loads((wd / "task_gate.json").read_text())
    assert len(gate) == 7 and sum(bool(v) for v in gate.values()) == 1

    with open(wd / "trial_stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3 * 2  # steps x prompts x samples: one row per trial
    assert len({r["trial_name"] for r in rows}) == len(rows)
    assert all(r["task_name"] != "test/inverted" for r in rows)
    for r in rows:
        assert r["outcome"] in {o.value for o in Outcome}
        assert r["task_name"] == r["task_id"] and r["agent_stop"]
        if r["excluded"] == "0":
            assert float(r["reward"]) == float(r["trial_reward"])
    metrics = [json.loads(line) for line in open(wd / "trainer_log.jsonl")]
    for m in metrics:
        if m["step"] >= 1:
            counts = {o.value: m[f"env/outcome_{o.value}"] for o in Outcome}
            assert sum(counts.values()) == 3 * 2
            step_rows = [r for r in rows if int(r["step"]) == m["step"]]
            for o, n in counts.items():
                assert n == sum(r["outcome"] == o for r in step_rows)
    md = (wd / "rollouts" / "step_000002.md").read_text()
    assert md.startswith("# Step 2: 6 episodes") and md.count("\n## ") == 6
    assert "### Turn 1" in md and "Terminal output:" in md and "**reward " in md and "Task:" in md
    rec = json.loads((wd / "rollouts" / "step_000001.jsonl").read_text().splitlines()[0])
    assert rec["episode"] and "commands" in rec["episode"][0] and rec["instruction"].startswith("Create the file")
    report = (wd / "report.md").read_text()
    assert "held-out success" in report and "1 task(s) excluded by the verifier sanity gate" in report
    # harbor.keep_trial_logs=False: every trial directory is removed, and so is trials/ (it was left empty)
    assert not (wd / "trials").exists()

    # Regression: the folder of a trial killed with its launch (kill -9) stayed in trials/ for good.
    # The next launch of the run (here one that finds the run complete) removes it.
    stale = wd / "trials" / "write-file-000__dead"
    (stale / "app" / "locked").mkdir(parents=True)
    (stale / "app" / "locked").chmod(0)  # as an agent may leave it
    out = _main(wd, *TINY, f"--config.data.dataset_path={data}", f"--config.data.eval_dataset_path={held}",
                "--config.data.verify_tasks=True")
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"jaxrl: removed 1 trial folder(s) in {wd}/trials left by a launch that was killed" in out.stderr
    assert not stale.exists()


def test_an_empty_trials_folder_is_removed_and_one_with_logs_kept(tmp_path):
    from jaxrl.train.harbor import remove_empty_trials_dir

    remove_empty_trials_dir(str(tmp_path))  # no trials/ (no trial ran): nothing to do
    (tmp_path / "trials").mkdir()
    remove_empty_trials_dir(str(tmp_path))
    assert not (tmp_path / "trials").exists()
    (tmp_path / "trials" / "t0" / "logs").mkdir(parents=True)  # harbor.keep_trial_logs=True
    remove_empty_trials_dir(str(tmp_path))
    assert (tmp_path / "trials" / "t0" / "logs").is_dir()


def test_harbor_config_keys_are_validated(tmp_path):
    c = terminal.get_config()
    validate(c)
    for key, value, match in [
        ("data.dataset_path", str(tmp_path / "missing"), "does not exist"),
        ("data.eval_dataset_path", "family:nosuch:0-3", "does not exist"),
        ("harbor.prompt_style", "fancy", "unknown style"),
        ("harbor.agent_timeout_sec", -1.0, "not a duration"),
        ("harbor.concurrency", -2, "must be >= 0"),
        ("generator.max_input_tokens", -1, "must be >= 0"),
        ("data.eval_task", "arithmetic", "cannot evaluate a Harbor run"),
    ]:
        c = set_key(terminal.get_config(), key, value)
        with pytest.raises(ConfigError, match=match) as e:
            validate(c)
        assert e.value.key == key, (key, e.value.key)


def test_8b_scale_has_the_seed_terminal_settings():
    for recipe in ("rloo", "seqmean", "grpo", "terminal"):
        mod = __import__(recipe)
        c = mod.get_config("qwen3_8b")
        sp = c.generator.sampling_params
        assert (sp.temperature, sp.top_p, sp.top_k) == (1.2, 0.95, 20), recipe  # 56GPU_qwen3_8b.yaml
        assert c.trainer.algorithm.temperature == 1.2
        assert (c.harbor.agent_timeout_sec, c.harbor.verifier_timeout_sec, c.harbor.prompt_style) == (900.0, 120.0,
                                                                                                      "terminus-2")
        assert (sp.max_generate_length, c.trainer.algorithm.max_seq_len, c.generator.max_input_tokens) == (
            4096, 32768, 32000)
        assert c.generator.logprobs_mode == "raw" and c.data.verify_tasks is True  # vLLM's raw_logprobs, as the seeds
        validate(c, num_devices=8, check_inputs=False)
    # symclip keeps its seed run's sampling (1.0 / 1.0 / -1)
    import symclip

    sp = symclip.get_config("qwen3_8b").generator.sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k) == (1.0, 1.0, -1)
    # "full" logprobs cannot come from vLLM at T 0.7 with top-p / top-k
    c = terminal.get_config("qwen3_8b")
    c.generator.logprobs_mode = "full"
    with pytest.raises(ConfigError, match="generator.logprobs_mode"):
        validate(c, num_devices=8, check_inputs=False)


def test_8b_scale_takes_a_harbor_parquet_set(tmp_path):
    """A DCAgent Parquet set built from shipped tasks is recognised as a Harbor task set by the
    `data.task=dataset` of every recipe's 8B scale, and loads both ways round."""
    import rloo

    from jaxrl.envs.harbor import write_parquet
    from jaxrl.train.harbor import HarborTasks, is_task_set

    dirs = [SHIPPED_TASKS_DIR / n for n in ("write-file-000", "py-return-000", "shell-sum-000")]
    pq = tmp_path / "set.parquet"
    write_parquet(dirs, pq)
    c = rloo.get_config("qwen3_8b")
    c.data.dataset_path = str(pq)
    c.data.eval_fraction, c.data.eval_split_seed = 0.5, 3
    assert c.data.task == "dataset" and is_task_set(str(pq)) and is_task_set(str(SHIPPED_TASKS_DIR))
    h = HarborTasks(c)
    names = ["jaxrl/py-return-000", "jaxrl/shell-sum-000", "jaxrl/write-file-000"]
    assert sorted(t.name for t in h.train_harbor + h.eval_harbor) == names
    # held out: ceil(0.5 x 3) = 2 tasks, the first by sha256("<split seed>:<name>")
    by_hash = sorted(names, key=lambda n: hashlib.sha256(f"3:{n}".encode()).digest())
    assert [t.name for t in h.eval_harbor] == by_hash[:2] and [t.name for t in h.train_harbor] == by_hash[2:]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "hi", "answer": "1"}\n')
    assert not is_task_set(str(jsonl))


def test_prompt_format_of_a_harbor_run_config():
    """Regression: `training_prompt_format` (jaxrl.chat on a run's rl_config.json) raised for a
    Harbor run (it looked `harbor` up as a built-in task). Harbor prompts are one user message."""
    from jaxrl.config import to_json_dict
    from jaxrl.envs.chat import PromptFormat
    from jaxrl.train.prompts import training_prompt_format

    c = to_json_dict(terminal.get_config())
    assert training_prompt_format(c) == PromptFormat(None, False, 0, ())
    c["data"].update(task="dataset", dataset_path=str(SHIPPED_TASKS_DIR))
    c["generator"]["enable_thinking"] = True
    assert training_prompt_format(c) == PromptFormat(None, True, 0, ())
