"""Multi-turn token assembly (token-in/token-out), loss masks, limits and stop reasons of run_rollouts."""
import re

import numpy as np
import pytest

from envs_fakes import ScriptedGenerator
from jaxrl.envs import (ChatTemplate, RolloutConfig, StepResult, Task, Trajectory, get_task_suite, make_env,
                        run_rollouts)
from jaxrl.rollout.types import Completion, SamplingParams

OBS_NO_THINK_TAIL = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def calc_tasks(pairs):
    suite = get_task_suite("calculator")
    return [suite.make_task(a, "*", b) for a, b in pairs]


def tool_call(expr):
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>' % expr


def calculator_policy(prompt, j):
    """Turn 1: a calculator call for the question; turn 2: the last tool result as the answer."""
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt)
    if not results:
        a, b = re.search(r"What is (\d+) \* (\d+)\?", prompt).groups()
        return tool_call(f"{a} * {b}")
    return f"<answer>{results[-1]}</answer>"


def masked_segments(mask):
    """[(start, end)] of the runs of 1s."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, i))
            start = None
    return out


def check_token_in_token_out(traj: Trajectory, gen: ScriptedGenerator, chat, expected_texts):
    """The prefix property, turn by turn, and the mask / logprob / text of every generated span."""
    prompt = traj.prompt_ids.tolist()
    full = prompt + traj.response_ids.tolist()
    P = len(prompt)
    mine = [c for c in gen.calls if c.prompt[:P] == prompt]
    assert len(mine) == traj.num_turns == len(expected_texts)
    expected_mask = np.zeros(len(traj.response_ids), np.int32)
    expected_lp = np.zeros(len(traj.response_ids), np.float32)
    for k, call in enumerate(mine):
        n = len(call.prompt)
        assert full[:n] == call.prompt  # what the engine saw is a prefix of the trajectory
        assert full[n:n + len(call.token_ids)] == call.token_ids  # sampled ids appended verbatim
        expected_mask[n - P:n - P + len(call.token_ids)] = 1
        expected_lp[n - P:n - P + len(call.token_ids)] = call.logprobs
        if k > 0:
            assert n > len(mine[k - 1].prompt) + len(mine[k - 1].token_ids)  # observation tokens in between
    assert mine[-1].prompt + mine[-1].token_ids == full  # last request + last completion = trajectory
    np.testing.assert_array_equal(traj.loss_mask, expected_mask)
    np.testing.assert_allclose(traj.rollout_logprobs, expected_lp, rtol=0, atol=0)
    resp = traj.response_ids.tolist()
    decoded = [chat.tokenizer.decode(resp[s:e]) for s, e in masked_segments(traj.loss_mask)]
    assert decoded == expected_texts


def test_multi_turn_tool_rollout_token_in_token_out(chat):
    pairs = [(347, 86), (120, 11), (999, 99)]  # products: 29842, 1320, 98901 (by hand)
    gen = ScriptedGenerator(chat, calculator_policy)
    trajs = run_rollouts(gen, chat, calc_tasks(pairs), SamplingParams(temperature=1.0),
                         RolloutConfig(max_turns=4, max_tokens_per_turn=64, max_seq_len=1024), group_ids=[10, 11, 12])
    assert [t.group_id for t in trajs] == [10, 11, 12]
    for (a, b), product, t in zip(pairs, [29842, 1320, 98901], trajs):
        assert t.stop_reason == "stop" and t.num_turns == 2 and t.reward == 1.0
        assert t.prompt_ids.dtype == np.int32 and t.loss_mask.dtype == np.int32
        assert t.rollout_logprobs.dtype == np.float32
        check_token_in_token_out(t, gen, chat, [tool_call(f"{a} * {b}") + "<|im_end|>",
                                                f"<answer>{product}</answer><|im_end|>"])
        # The observation span: closing newline, tool response in a user turn, next assistant header.
        (s0, e0), (s1, _) = masked_segments(t.loss_mask)
        obs = chat.tokenizer.decode(t.response_ids[e0:s1].tolist())
        assert obs == f"\n<|im_start|>user\n<tool_response>\n{product}\n</tool_response>" + OBS_NO_THINK_TAIL
        assert t.info["num_tool_calls"] == 1 and t.info["num_tool_errors"] == 0
        assert t.info["task_id"] == f"calculator/{a}*{b}"
    # One batched generate call per turn for all live conversations.
    assert [n for n, _ in gen.batches] == [3, 3]


def test_three_turns_with_a_malformed_call(chat):
    def policy(prompt, j):
        n = prompt.count("<tool_response>")
        return ['<tool_call>\n{"name": calculator}\n</tool_call>', tool_call("6 * 7"), "<answer>42</answer>"][n]

    task = Task(messages=[{"role": "user", "content": "What is 6 * 7?"}],
                reward_spec={"type": "answer_tag", "answer": "42"}, env="tool", tools=("calculator",))
    gen = ScriptedGenerator(chat, policy)
    (t,) = run_rollouts(gen, chat, [task], SamplingParams(), RolloutConfig(max_turns=3, max_seq_len=2048))
    assert (t.stop_reason, t.num_turns, t.reward) == ("stop", 3, 1.0)
    assert t.info["num_tool_calls"] == 2 and t.info["num_tool_errors"] == 1
    check_token_in_token_out(t, gen, chat, ['<tool_call>\n{"name": calculator}\n</tool_call><|im_end|>',
                                            tool_call("6 * 7") + "<|im_end|>", "<answer>42</answer><|im_end|>"])


def test_single_turn_groups_and_n_samples(chat):
    suite = get_task_suite("arithmetic")
    tasks = [suite.make_task(37, "+", 48), suite.make_task(90, "-", 7)]

    def policy(prompt, j):
        a, op, b = re.search(r"What is (\d+) ([+-]) (\d+)\?", prompt).groups()
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        return f"<answer>{value if j % 2 == 0 else value + 1}</answer>"

    gen = ScriptedGenerator(chat, policy)
    trajs = run_rollouts(gen, chat, tasks, SamplingParams(), RolloutConfig(n_samples_per_prompt=4))
    assert len(trajs) == 8
    assert [t.group_id for t in trajs] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [t.info["sample_index"] for t in trajs] == [0, 1, 2, 3] * 2
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 0.0] * 2
    # Turn 0: each distinct prompt sent once with n = n_samples_per_prompt.
    assert len(gen.batches) == 1 and gen.batches[0][0] == 2 and gen.batches[0][1].n == 4
    for k, t in enumerate(trajs):
        value = 85 if k < 4 else 83
        text = f"<answer>{value if k % 2 == 0 else value + 1}</answer><|im_end|>"
        assert t.stop_reason == "stop" and t.num_turns == 1
        assert t.loss_mask.tolist() == [1] * len(t.response_ids)
        assert chat.tokenizer.decode(t.response_ids.tolist()) == text
        assert chat.tokenizer.decode(t.prompt_ids.tolist()).endswith(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_thinking_mode_reasoning_is_trained_but_not_scored(tok):
    chat = ChatTemplate(tok, enable_thinking=True)
    text = "<think>\nadd the numbers\n</think>\n\n<answer>85</answer>"
    gen = ScriptedGenerator(chat, lambda p, j: text)
    (t,) = run_rollouts(gen, chat, [get_task_suite("arithmetic").make_task(37, "+", 48)], SamplingParams(),
                        RolloutConfig())
    assert t.reward == 1.0 and t.info["extracted_answer"] == "85"
    assert tok.decode(t.prompt_ids.tolist()).endswith("What is 37 + 48?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(t.response_ids.tolist()) == text + "<|im_end|>"
    assert t.loss_mask.sum() == len(t.response_ids)


def test_max_turns(chat):
    gen = ScriptedGenerator(chat, lambda p, j: tool_call("1 + 1"))
    (t,) = run_rollouts(gen, chat, calc_tasks([(100, 10)]), SamplingParams(), RolloutConfig(max_turns=2))
    assert (t.stop_reason, t.num_turns, t.reward) == ("max_turns", 2, 0.0)
    assert t.loss_mask[-1] == 1 and t.response_ids[-1] == chat.turn_end_id  # ends on the last generated token
    check_token_in_token_out(t, gen, chat, [tool_call("1 + 1") + "<|im_end|>"] * 2)


def test_max_tokens_per_turn(chat, tok):
    gen = ScriptedGenerator(chat, lambda p, j: "<answer>12345678</answer>")
    (t,) = run_rollouts(gen, chat, [get_task_suite("arithmetic").make_task(1, "+", 2)], SamplingParams(),
                        RolloutConfig(max_tokens_per_turn=5))
    assert gen.batches[0][1].max_tokens == 5
    assert t.stop_reason == "length" and t.info["truncated_by"] == "max_tokens_per_turn" and t.reward == 0.0
    assert len(t.response_ids) == 5 and t.loss_mask.tolist() == [1] * 5
    expected_ids = tok.encode("<answer>12345678</answer>", add_special_tokens=False)[:5]
    assert t.response_ids.tolist() == expected_ids


def test_max_seq_len_limits_generation_and_observations(chat):
    tasks = calc_tasks([(347, 86)])
    (full,) = run_rollouts(ScriptedGenerator(chat, calculator_policy), chat, tasks, SamplingParams(),
                           RolloutConfig(max_turns=2, max_seq_len=4096))
    (s0, e0), (s1, e1) = masked_segments(full.loss_mask)
    before_turn2 = len(full.prompt_ids) + s1  # tokens the engine sees at turn 2

    # Room for 3 tokens in turn 2: the request asks for 3 and the trajectory fills max_seq_len.
    gen = ScriptedGenerator(chat, calculator_policy)
    (t,) = run_rollouts(gen, chat, tasks, SamplingParams(), RolloutConfig(max_turns=2, max_seq_len=before_turn2 + 3))
    P = len(full.prompt_ids)
    assert [p.max_tokens for _, p in gen.batches] == [min(256, before_turn2 + 3 - P), 3]
    assert t.stop_reason == "length" and t.info["truncated_by"] == "max_seq_len"
    assert len(t.prompt_ids) + len(t.response_ids) == before_turn2 + 3
    assert t.response_ids.tolist() == full.response_ids[:s1 + 3].tolist()

    # The observation would leave no room for a generated token: stop before appending it.
    gen = ScriptedGenerator(chat, calculator_policy)
    (t,) = run_rollouts(gen, chat, tasks, SamplingParams(), RolloutConfig(max_turns=2, max_seq_len=before_turn2))
    assert t.stop_reason == "length" and t.info["truncated_by"] == "max_seq_len" and t.num_turns == 1
    assert t.response_ids.tolist() == full.response_ids[:e0].tolist() and t.loss_mask.all()

    with pytest.raises(ValueError, match="max_seq_len"):
        run_rollouts(gen, chat, tasks, SamplingParams(), RolloutConfig(max_seq_len=len(full.prompt_ids)))


class _BrokenEnv:
    tools = None

    def __init__(self, error=True):
        self.error = error

    def reset(self, task):
        return list(task.messages)

    def step(self, text):
        if self.error:
            raise RuntimeError("boom")
        return StepResult([], 0.5, False, {})  # not done, but nothing to say


def test_env_errors_end_only_that_trajectory(chat):
    suite = get_task_suite("arithmetic")
    tasks = [suite.make_task(1, "+", 1), suite.make_task(2, "+", 2), suite.make_task(3, "+", 3)]
    envs = {tasks[1].task_id: lambda: _BrokenEnv(True), tasks[2].task_id: lambda: _BrokenEnv(False)}

    def factory(task):
        return envs[task.task_id]() if task.task_id in envs else make_env(task)

    gen = ScriptedGenerator(chat, lambda p, j: "<answer>2</answer>")
    good, broken, silent = run_rollouts(gen, chat, tasks, SamplingParams(), RolloutConfig(max_turns=3),
                                        make_env=factory)
    assert (good.stop_reason, good.reward) == ("stop", 1.0)
    assert (broken.stop_reason, broken.reward, broken.info["error"]) == ("env_error", 0.0, "RuntimeError: boom")
    assert silent.stop_reason == "env_error" and "no observation" in silent.info["error"]
    assert broken.num_turns == 1 and broken.loss_mask.all()


def test_env_workers_and_seeds_and_stop_ids(chat):
    tasks = calc_tasks([(347, 86), (120, 11)])
    params = SamplingParams(seed=5, stop_token_ids=(7,))
    results = []
    for workers in (1, 2):
        gen = ScriptedGenerator(chat, calculator_policy)
        results.append(run_rollouts(gen, chat, tasks, params, RolloutConfig(max_turns=2, env_workers=workers)))
        seeds = [p.seed for _, p in gen.batches]
        assert None not in seeds and len(set(seeds)) == len(seeds)
        assert all(p.stop_token_ids == (7, 505, 503) for _, p in gen.batches)
    for a, b in zip(*results):
        assert a.response_ids.tolist() == b.response_ids.tolist() and a.reward == b.reward


def test_policy_version_is_oldest_turn(chat):
    class Bumping(ScriptedGenerator):
        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            self.policy_version += 1
            return out

    gen = Bumping(chat, calculator_policy, policy_version=3)
    (t,) = run_rollouts(gen, chat, calc_tasks([(100, 10)]), SamplingParams(), RolloutConfig(max_turns=2))
    assert t.num_turns == 2 and t.policy_version == 3


def test_generator_contract_violations(chat):
    class Short:
        def generate(self, prompts, params):
            return [[Completion([1, 2], [0.0], "stop")] for _ in prompts]

    class Missing:
        def generate(self, prompts, params):
            return []

    task = get_task_suite("arithmetic").make_task(1, "+", 1)
    with pytest.raises(RuntimeError, match="logprobs"):
        run_rollouts(Short(), chat, [task], SamplingParams(), RolloutConfig())
    with pytest.raises(RuntimeError, match="results for 1 prompts"):
        run_rollouts(Missing(), chat, [task], SamplingParams(), RolloutConfig())


def test_trajectory_validation():
    with pytest.raises(ValueError, match="same length"):
        Trajectory(np.zeros(2, np.int32), np.zeros(3, np.int32), np.zeros(2, np.int32), np.zeros(3, np.float32),
                   0.0, "stop", 0, 0, 1)
    with pytest.raises(ValueError, match="stop_reason"):
        Trajectory(np.zeros(2, np.int32), np.zeros(3, np.int32), np.zeros(3, np.int32), np.zeros(3, np.float32),
                   0.0, "done", 0, 0, 1)
    with pytest.raises(ValueError, match="max_turns"):
        RolloutConfig(max_turns=0)
