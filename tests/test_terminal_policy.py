"""The embedded terminal policy (`jaxrl/assets/terminal_policy`) and its build script
(scripts/make_terminal_policy.py).

Checks: the shipped files and size; loading in transformers and jaxrl with matching logits; that a
training episode is exactly the token stream the real agent loop produces with a sandboxed trial
(the simulated shell echo included); determinism of the training; the held-out success through the
agent loop; and (slow) that the script reproduces the shipped files.
"""
import importlib.util
import json
import os
import sys

import jax
import numpy as np
import pytest

from harbor_helpers import make_task  # noqa: F401  (sandbox availability is checked by the harbor tests)
from jaxrl.envs.base import RolloutConfig, run_rollouts
from jaxrl.envs.chat import ChatTemplate
from jaxrl.envs.harbor import load_task_set
from jaxrl.envs.harbor.agent import AgentConfig, TerminusEnvFactory, rollout_tasks
from jaxrl.envs.harbor.families import generate_tasks
from jaxrl.models import hf_io, qwen3
from jaxrl.rollout.types import Completion, SamplingParams

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICY = os.path.join(REPO, "jaxrl", "assets", "terminal_policy")


def _load_script():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    spec = importlib.util.spec_from_file_location("make_terminal_policy",
                                                  os.path.join(REPO, "scripts", "make_terminal_policy.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


mtp = _load_script()


@pytest.fixture(scope="module")
def chat():
    return ChatTemplate.from_pretrained(POLICY, enable_thinking=False)


def test_shipped_files_and_size(chat):
    names = set(os.listdir(POLICY))
    assert set(mtp.TOKENIZER_FILES + mtp.WEIGHT_FILES) <= names
    total = sum(os.path.getsize(os.path.join(POLICY, n)) for n in names)
    assert total <= 5 * 2**20, f"terminal policy is {total / 2**20:.1f} MiB > 5 MiB"
    with open(os.path.join(POLICY, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "qwen3" and cfg["vocab_size"] == mtp.VOCAB_SIZE == len(chat.tokenizer)
    im_end, eot = chat.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert cfg["eos_token_id"] == im_end and chat.stop_token_ids == (im_end, eot)
    with open(os.path.join(POLICY, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == [im_end, eot]
    # the task's words and file names are single tokens (what the policy copies)
    assert len(chat.encode_text(" daisy")) == 1 and len(chat.encode_text("/token")) == 1


def test_loads_in_transformers_and_jaxrl_with_matching_logits(chat):
    import torch
    from transformers import AutoModelForCausalLM

    from jaxrl.envs.harbor.families import make_task as family_task

    model = AutoModelForCausalLM.from_pretrained(POLICY, local_files_only=True).eval()
    cfg, params = hf_io.load_hf_checkpoint(POLICY, dtype="float32", remat="none")
    ids, _ = mtp.episode_example(chat, family_task("write-file", 1999))
    tokens = np.asarray([ids], np.int32)
    with torch.no_grad():
        ref = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    ours = np.asarray(qwen3.forward(params, cfg, tokens, np.arange(len(ids), dtype=np.int32)[None],
                                    np.ones_like(tokens)))
    assert np.max(np.abs(ours - ref)) <= 1e-4


class _Scripted:
    """Answers every request with the next scripted turn (token ids)."""

    def __init__(self, turns):
        self.turns = list(turns)

    def generate(self, prompts, params):
        ids = self.turns.pop(0)
        return [[Completion(list(ids), [0.0] * len(ids), "stop") for _ in range(params.n)] for _ in prompts]


@pytest.mark.parametrize("seed", [3, 1234])
def test_training_episode_is_the_real_agent_loop_token_stream(chat, tmp_path, seed):
    """The SFT episode (with the simulated shell echo) equals what the agent loop assembles from a
    sandboxed trial given the same two turns, and the trial's verifier pays 1."""
    from jaxrl.envs.harbor.families import make_task as family_task

    spec = family_task("write-file", seed)
    generate_tasks("write-file", [seed], tmp_path)
    _, turn1, turn2, _ = mtp.episode_messages(spec)
    turns = [chat.encode_text(turn1) + [chat.turn_end_id], chat.encode_text(turn2) + [chat.turn_end_id]]
    (traj,) = run_rollouts(_Scripted(turns), chat, rollout_tasks(load_task_set(tmp_path)), SamplingParams(),
                           RolloutConfig(max_turns=4, max_tokens_per_turn=96, max_seq_len=1024),
                           make_env=TerminusEnvFactory(AgentConfig(prompt_style="compact")))
    assert (traj.reward, traj.info["outcome"], traj.num_turns) == (1.0, "ok", 2)
    ids, flags = mtp.episode_example(chat, spec)
    assert ids == list(traj.prompt_ids) + list(traj.response_ids)
    assert flags == [0] * len(traj.prompt_ids) + list(traj.loss_mask)


def test_training_is_deterministic_and_lowers_the_loss(tmp_path):
    mtp.write_tokenizer(str(tmp_path))
    for name in mtp.TOKENIZER_FILES:  # the tokenizer is reproduced byte for byte
        with open(os.path.join(POLICY, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name
    s = mtp.Settings(batch_size=4)
    p1, _, l1 = mtp.train(str(tmp_path), s, steps=3)
    p2, _, l2 = mtp.train(str(tmp_path), s, steps=3)
    assert l1 == l2 and l1[-1] < l1[0]
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(a, b)


def test_held_out_success_leaves_room_for_rl():
    """Through the real agent loop (sandboxed trials) on held-out write-file tasks, at the recipe's
    sampling temperature: the policy solves some tasks but far from all."""
    r = mtp.evaluate(POLICY, num_tasks=64, n=2, greedy=False)
    print(r)
    assert 0.1 <= r["sampled_mean"] <= 0.65, r
    assert r["pass_at_2"] >= r["sampled_mean"]


@pytest.mark.slow
def test_script_reproduces_the_shipped_policy():
    assert mtp.check(mtp.Settings(), POLICY)
