"""The seed runs' error policy (jaxrl/train/error_policy.py): per error class mask / passthrough /
zero with retries, on real sandboxed trials played through the agent loop, and what the trainer
does with each (masked = excluded from the loss and the baselines). Expected values by hand from the
task's logic and the policy's rules."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from envs_fakes import ScriptedGenerator
from harbor_helpers import make_task
from jaxrl.config import ConfigError, validate
from jaxrl.envs import RolloutConfig, run_rollouts
from jaxrl.envs.harbor import TrialConfig
from jaxrl.envs.harbor.agent import AgentConfig, TerminusEnvFactory, rollout_tasks
from jaxrl.rollout.types import SamplingParams
from jaxrl.train import error_policy as ep_lib
from jaxrl.train.batching import is_excluded, pack_trajectories
from jaxrl.train.harbor import outcome_metrics, trial_fields

# reward 1 iff /app/done.txt holds "done"; no reward file at all when /app/none exists; an empty one
# when /app/empty exists; a bare-number reward.json (Harbor accepts it) when /app/json exists
TEST_SH = """#!/bin/bash
[ -e /app/none ] && exit 0
[ -e /app/empty ] && { : > /logs/verifier/reward.txt; exit 0; }
[ -e /app/slow ] && sleep 300
if [ "$(cat /app/done.txt 2>/dev/null)" = done ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def reply(cmd, complete=True):
    return json.dumps({"analysis": "a", "plan": "p", "commands": [{"keystrokes": cmd, "duration": 5}],
                       "task_complete": complete})


SEED = ep_lib.ErrorPolicy(
    mask=("DaytonaError", "EnvironmentStartTimeoutError", "NetworkError", "ConnectionError", "RewardFileNotFoundError",
          "RewardFileEmptyError", "AgentEnvironmentTimeoutError", "ContextLengthExceededError"),
    passthrough=("AgentTimeoutError",), default="zero",
    no_retry=("VerifierTimeoutError", "VerifierRuntimeError", "RewardFileNotFoundError", "RewardFileEmptyError",
              "VerifierOutputParseError"), max_retries=3, min_wait_sec=0.0, max_wait_sec=0.0)


def _play(chat, tasks, actions, policy, *, verifier_timeout=None, agent_timeout=None, max_turns=1):
    """Each task's sample j plays `actions[task][attempt]` (a shell command) in one turn."""
    attempt_of = {}

    def scripted(text, j):
        for name, acts in actions.items():
            if f"TASK {name}." in text:
                k = attempt_of.get(name, 0)
                return reply(acts[min(k, len(acts) - 1)])
        raise AssertionError(text)

    def generate(ts, n, attempt):
        for t in ts:
            attempt_of[t.metadata["harbor_task"].name.split("/")[-1]] = attempt
        gen = ScriptedGenerator(chat, scripted)
        trial = TrialConfig(keep="none", verifier_timeout_sec=verifier_timeout, agent_timeout_sec=agent_timeout)
        cfg = RolloutConfig(n_samples_per_prompt=n, max_turns=max_turns, max_tokens_per_turn=400, max_seq_len=4096,
                            env_workers=4)
        return run_rollouts(gen, chat, ts, SamplingParams(), cfg,
                            make_env=TerminusEnvFactory(AgentConfig(prompt_style="compact", trial=trial)))

    return ep_lib.with_retries(policy, generate, rollout_tasks(tasks), 1, sleep=lambda s: None)


def _tasks(tmp_path, names):
    return [make_task(tmp_path, n, test_sh=TEST_SH, instruction=f"TASK {n}. Write done to /app/done.txt.")
            for n in names]


def test_each_class_gets_its_treatment_and_retries(chat, tmp_path):
    tasks = _tasks(tmp_path, ["ok", "missing", "empty", "zero"])
    actions = {
        "ok": ["echo done > /app/done.txt\n"],
        "missing": ["touch /app/none\n"],  # RewardFileNotFoundError: masked, never retried
        "empty": ["touch /app/empty\n"],  # RewardFileEmptyError: masked, never retried
        "zero": ["echo nope > /app/done.txt\n"],  # ok with reward 0
    }
    trajs = _play(chat, tasks, actions, SEED)
    by = {t.info["task_id"].split("/")[-1]: t for t in trajs}
    assert (by["ok"].reward, by["ok"].info["error_class"], by["ok"].info["attempts"]) == (1.0, "", 1)
    assert (by["missing"].info["error_class"], by["missing"].info["error_treatment"]) == ("reward_missing", "mask")
    assert by["missing"].info["attempts"] == 1 and is_excluded(by["missing"])
    assert (by["empty"].info["error_class"], by["empty"].info["error_treatment"]) == ("reward_empty", "mask")
    assert by["zero"].reward == 0.0 and not is_excluded(by["zero"])
    m = outcome_metrics(trajs)
    assert m["env/error_reward_missing"] == 1 and m["env/error_reward_empty"] == 1
    assert m["env/treatment_mask"] == 2
    row = trial_fields(by["missing"].info)
    assert (row["error_class"], row["error_treatment"], row["attempts"]) == ("reward_missing", "mask", 1)


def test_retryable_failure_is_played_again(chat, tmp_path):
    # A verifier timeout is an error class; the seed does not retry it, a policy without no_retry does.
    tasks = _tasks(tmp_path, ["slow"])
    actions = {"slow": ["touch /app/slow\n", "echo done > /app/done.txt\n"]}
    retrying = ep_lib.ErrorPolicy(max_retries=2, min_wait_sec=0.0, max_wait_sec=0.0)
    [t] = _play(chat, tasks, actions, retrying, verifier_timeout=8.0)
    assert (t.reward, t.info["error_class"], t.info["attempts"]) == (1.0, "", 2)  # the retry succeeded
    [t] = _play(chat, tasks, actions, SEED, verifier_timeout=8.0)
    assert (t.info["error_class"], t.info["error_treatment"], t.info["attempts"], t.reward) == (
        "verifier_timeout", "zero", 1, 0.0)  # VerifierTimeoutError: no retry, default zero


def test_masked_trajectory_leaves_the_loss(chat, tmp_path):
    tasks = _tasks(tmp_path, ["missing"])
    [t] = _play(chat, tasks, {"missing": ["touch /app/none\n"]}, SEED)
    batch = pack_trajectories([t], None, (512, 1024, 4096))
    assert batch["sequence_mask"].tolist() == [False] and float(np.sum(batch["loss_mask"])) == 0.0


def test_policy_names_and_waits():
    assert ep_lib.error_class("RewardFileNotFoundError") == "reward_missing"
    assert SEED.treatment("sandbox_error") == "mask" and SEED.treatment("agent_timeout") == "passthrough"
    assert SEED.treatment("reward_unparsable") == "zero" and not SEED.retryable("verifier_timeout")
    p = ep_lib.ErrorPolicy(max_retries=3, min_wait_sec=60.0, max_wait_sec=600.0, wait_multiplier=2.0)
    assert [p.wait_sec(a) for a in (1, 2, 3, 9)] == [60.0, 60.0, 60.0, 600.0]  # clip(2 * 2**a, 60, 600)
    with pytest.raises(ValueError, match="unknown error class"):
        ep_lib.ErrorPolicy(mask=("Nope",))
    with pytest.raises(ValueError, match="both mask and zero"):
        ep_lib.ErrorPolicy(mask=("reward_missing",), zero=("RewardFileNotFoundError",))


def test_8b_default_is_the_seed_policy_and_bad_names_are_one_line():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
    import rloo

    c = rloo.get_config("qwen3_8b")
    p = ep_lib.ErrorPolicy.from_config(c.harbor.error_policy)
    assert (p.max_retries, p.min_wait_sec, p.max_wait_sec, p.wait_multiplier) == (3, 60.0, 600.0, 2.0)
    assert {ep_lib.error_class(n) for n in p.mask} == {"sandbox_error", "reward_missing", "reward_empty",
                                                       "context_length_exceeded"}
    c.harbor.error_policy.mask = ("NoSuchError",)
    with pytest.raises(ConfigError, match="harbor.error_policy"):
        validate(c, num_devices=8, check_inputs=False)


def test_rl_config_states_the_logprob_definitions(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
    import rloo
    from jaxrl.train.rundir import check_resume_config

    c = rloo.get_config("qwen3_8b")
    check_resume_config(c, str(tmp_path), write=True)
    d = json.loads((tmp_path / "rl_config.json").read_text())["_derived"]["logprobs"]
    assert d["trainer"] == "log_softmax(logits / 1.2) over the full vocabulary"
    assert d["engine"].startswith("log_softmax(logits) at temperature 1") and "raw_logprobs" in d["engine"]
    assert d["sampling"] == "temperature 1.2, top-p 0.95, top-k 20"
    check_resume_config(c, str(tmp_path), write=False)  # the notes do not count as a config difference
    from jaxrl.policy import read_run_config

    assert read_run_config(str(tmp_path / "rl_config.json")).generator.logprobs_mode == "raw"
