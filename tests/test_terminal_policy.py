"""The embedded terminal policy (`jaxrl/assets/terminal_policy`) and its build script
(scripts/make_terminal_policy.py).

Checks: the shipped files and size; loading in transformers and jaxrl with matching logits; that a
training episode is exactly the token stream the real agent loop produces with a sandboxed trial
(the simulated shell echo included); determinism of the training; the held-out success through the
agent loop; and (slow) that the script reproduces the shipped files.
"""
import os

import pytest

from envs_fakes import ScriptedTurns
from harbor_helpers import make_task  # noqa: F401  (sandbox availability is checked by the harbor tests)
from jaxrl.envs.base import RolloutConfig, run_rollouts
from jaxrl.envs.chat import ChatTemplate
from jaxrl.envs.harbor import load_task_set
from jaxrl.envs.harbor.agent import AgentConfig, TerminusEnvFactory, rollout_tasks
from jaxrl.envs.harbor.families import generate_tasks
from jaxrl.rollout.types import SamplingParams
from policy_helpers import (REPO, assert_deterministic_and_learning, assert_transformers_logits_match, load_script,
                            shipped_config)

POLICY = os.path.join(REPO, "jaxrl", "assets", "terminal_policy")
mtp = load_script("make_terminal_policy")


@pytest.fixture(scope="module")
def chat():
    return ChatTemplate.from_pretrained(POLICY, enable_thinking=False)


def test_shipped_files_and_size(chat):
    cfg, gen = shipped_config(POLICY, mtp.TOKENIZER_FILES + mtp.WEIGHT_FILES, max_mib=5)
    assert cfg["vocab_size"] == mtp.VOCAB_SIZE == len(chat.tokenizer)
    im_end, eot = chat.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert cfg["eos_token_id"] == im_end and chat.stop_token_ids == (im_end, eot)
    assert gen["eos_token_id"] == [im_end, eot]
    # the task's words and file names are single tokens (what the policy copies)
    assert len(chat.encode_text(" daisy")) == 1 and len(chat.encode_text("/token")) == 1


def test_loads_in_transformers_and_jaxrl_with_matching_logits(chat):
    from jaxrl.envs.harbor.families import make_task as family_task

    ids, _ = mtp.episode_example(chat, family_task("write-file", 1999))
    assert_transformers_logits_match(POLICY, [ids])


@pytest.mark.parametrize("seed", [3, 1234])
def test_training_episode_is_the_real_agent_loop_token_stream(chat, tmp_path, seed):
    """The SFT episode (with the simulated shell echo) equals what the agent loop assembles from a
    sandboxed trial given the same two turns, and the trial's verifier pays 1."""
    from jaxrl.envs.harbor.families import make_task as family_task

    spec = family_task("write-file", seed)
    generate_tasks("write-file", [seed], tmp_path)
    _, turn1, turn2, _ = mtp.episode_messages(spec)
    turns = [chat.encode_text(turn1) + [chat.turn_end_id], chat.encode_text(turn2) + [chat.turn_end_id]]
    (traj,) = run_rollouts(ScriptedTurns(turns), chat, rollout_tasks(load_task_set(tmp_path)), SamplingParams(),
                           RolloutConfig(max_turns=4, max_tokens_per_turn=96, max_seq_len=1024),
                           make_env=TerminusEnvFactory(AgentConfig(prompt_style="compact")))
    assert (traj.reward, traj.info["outcome"], traj.num_turns) == (1.0, "ok", 2)
    ids, flags = mtp.episode_example(chat, spec)
    assert ids == list(traj.prompt_ids) + list(traj.response_ids)
    assert flags == [0] * len(traj.prompt_ids) + list(traj.loss_mask)


@pytest.mark.slow  # covered faster: the shared builder's determinism in test_default_policy
def test_training_is_deterministic_and_lowers_the_loss(tmp_path):
    mtp.write_tokenizer(str(tmp_path))
    for name in mtp.TOKENIZER_FILES:  # the tokenizer is reproduced byte for byte
        with open(os.path.join(POLICY, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name
    s = mtp.Settings(batch_size=4)
    assert_deterministic_and_learning(lambda: mtp.train(str(tmp_path), s, steps=3)[::2])  # (params, losses)


def test_held_out_success_leaves_room_for_rl():
    """Through the real agent loop (sandboxed trials) on held-out write-file tasks, at the recipe's
    sampling temperature: the policy solves some tasks but far from all."""
    # 32 tasks x 2 samples: measured sampled mean 33%, pass@2 50% (64 tasks: 31% / 48%)
    r = mtp.evaluate(POLICY, num_tasks=32, n=2, greedy=False)
    print(r)
    assert 0.1 <= r["sampled_mean"] <= 0.65, r
    assert r["pass_at_2"] >= r["sampled_mean"]


@pytest.mark.slow
def test_script_reproduces_the_shipped_policy():
    assert mtp.check(mtp.Settings(), POLICY)
