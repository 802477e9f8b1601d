"""Reward specs and the built-in tasks (arithmetic, arithmetic_partial, calculator): hand-written answers."""
import pytest

from jaxrl.envs import TASK_REGISTRY, compute_reward, get_task_suite, make_env, validate_reward_spec


# ---- reward specs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("response,reward", [
    ("42", 1.0), ("  42\n", 1.0), ("<answer>42</answer>", 1.0), ("x <answer>1</answer> <answer> 42 </answer>", 1.0),
    ("41", 0.0), ("42.0", 0.0), ("The answer is 42", 0.0), ("<answer>4 2</answer>", 0.0), ("", 0.0),
])
def test_exact_match(response, reward):
    assert compute_reward({"type": "exact_match", "answer": "42"}, response) == reward


@pytest.mark.parametrize("response,reward", [
    ("The answer is 42", 1.0), ("42.0", 1.0), ("<answer>42</answer> not 7", 1.0), ("1,042 - 1,000 = 42", 1.0),
    ("The answer is 43", 0.0), ("<answer>forty-two</answer> 42", 0.0), ("no number", 0.0), ("", 0.0),
])
def test_numeric(response, reward):
    assert compute_reward({"type": "numeric", "answer": "42"}, response) == reward


def test_numeric_tolerance():
    assert compute_reward({"type": "numeric", "answer": "3.14159", "tolerance": 0.01}, "about 3.14") == 1.0
    assert compute_reward({"type": "numeric", "answer": "3.14159", "tolerance": 0.001}, "about 3.14") == 0.0


@pytest.mark.parametrize("response,exact,partial", [
    ("<answer>85</answer>", 1.0, 1.0),
    ("So: <answer> 85 </answer>", 1.0, 1.0),
    ("<answer>085</answer>", 1.0, 1.0),          # compared as numbers
    ("<answer>84</answer>", 0.0, 0.1),           # well-formed but wrong: format credit only
    ("<answer>eighty-five</answer>", 0.0, 0.1),
    ("85", 0.0, 0.0),                            # malformed: no tag
    ("<answer>85", 0.0, 0.0),
    ("<answer></answer>", 0.0, 0.0),
    ("<answer>85</answer><answer>85</answer>", 0.0, 0.0),  # several answers
])
def test_answer_tag(response, exact, partial):
    assert compute_reward({"type": "answer_tag", "answer": "85"}, response) == exact
    assert compute_reward({"type": "answer_tag", "answer": "85", "format_reward": 0.1}, response) == partial


@pytest.mark.parametrize("spec,field", [
    ({"type": "fuzzy", "answer": "1"}, "reward_spec.type"),
    ({"type": "exact_match"}, "reward_spec.answer"),
    ({"type": "exact_match", "answer": 42}, "reward_spec.answer"),
    ({"type": "numeric", "answer": "abc"}, "reward_spec.answer"),
    ({"type": "numeric", "answer": "1", "tolerance": -1}, "reward_spec.tolerance"),
    ({"type": "answer_tag", "answer": "1", "format_reward": 1.5}, "reward_spec.format_reward"),
    ({"type": "answer_tag", "answer": "1", "bonus": 1}, "reward_spec.bonus"),
    ("exact_match", "reward_spec"),
])
def test_invalid_specs_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate_reward_spec(spec)


# ---- arithmetic ----------------------------------------------------------------------------------
def test_registry():
    assert {"arithmetic", "arithmetic_partial", "calculator"} <= set(TASK_REGISTRY)
    with pytest.raises(ValueError, match="registered tasks: .*arithmetic"):
        get_task_suite("chess")


def _step_reward(task, text):
    env = make_env(task)
    env.reset(task)
    observations, reward, done, info = env.step(text)
    assert observations == [] and done
    return reward


def test_arithmetic_task_and_rewards():
    exact, partial = get_task_suite("arithmetic"), get_task_suite("arithmetic_partial")
    task = exact.make_task(37, "+", 48)
    assert task.messages == [{"role": "system", "content": "Answer with the result in <answer></answer> tags."},
                             {"role": "user", "content": "What is 37 + 48?"}]
    for text, r_exact, r_partial in [("<answer>85</answer>", 1.0, 1.0), ("<answer>84</answer>", 0.0, 0.1),
                                     ("85", 0.0, 0.0), ("<answer>85", 0.0, 0.0)]:
        assert _step_reward(task, text) == r_exact
        assert _step_reward(partial.make_task(37, "+", 48), text) == r_partial
    assert _step_reward(exact.make_task(90, "-", 7), "<answer>83</answer>") == 1.0
    assert _step_reward(get_task_suite("arithmetic", ops="*").make_task(12, "*", 12), "<answer>144</answer>") == 1.0


def test_arithmetic_splits_disjoint_and_complete():
    suite = get_task_suite("arithmetic")
    splits = suite.splits_problems()
    train, held_out = set(splits["train"]), set(splits["eval"])
    assert not train & held_out
    # "+": 100 * 100 problems; "-" with a >= b: 100 * 101 / 2 = 5050 problems.
    assert len(train) + len(held_out) == 10000 + 5050
    assert 0.08 < len(held_out) / 15050 < 0.12
    for a, op, b in list(held_out)[:50]:
        assert 0 <= a <= 99 and 0 <= b <= 99 and op in "+-" and (op == "+" or a >= b)
    # Membership depends only on the problem and split_seed, not on the operand range.
    small = get_task_suite("arithmetic", max_operand=20).splits_problems()
    assert set(small["eval"]) <= held_out and set(small["train"]) <= train
    other_seed = get_task_suite("arithmetic", split_seed=1).splits_problems()
    assert set(other_seed["eval"]) != held_out


def test_arithmetic_dataset_sampling():
    suite = get_task_suite("arithmetic")
    a = suite.dataset("eval", num=20, seed=3)
    b = suite.dataset("eval", num=20, seed=3)
    c = suite.dataset("eval", num=20, seed=4)
    assert [t.task_id for t in a] == [t.task_id for t in b] != [t.task_id for t in c]
    assert len(suite.dataset("eval")) == len(suite.splits_problems()["eval"])
    train_ids = {t.task_id for t in suite.dataset("train")}
    assert not train_ids & {t.task_id for t in suite.dataset("eval")}
    for t in a:
        m = t.metadata
        expected = m["a"] + m["b"] if m["op"] == "+" else m["a"] - m["b"]
        assert t.reward_spec == {"type": "answer_tag", "answer": str(expected), "format_reward": 0.0}
        assert t.messages[-1]["content"] == f"What is {m['a']} {m['op']} {m['b']}?" and m["split"] == "eval"
    with pytest.raises(ValueError, match="split"):
        suite.dataset("test")
    with pytest.raises(ValueError, match="num"):
        suite.dataset("eval", num=10**6)
    with pytest.raises(ValueError, match="ops"):
        get_task_suite("arithmetic", ops="/")


# ---- calculator (multi-turn tool use) ----------------------------------------------------------------
def test_calculator_episode():
    suite = get_task_suite("calculator")
    task = suite.make_task(347, "*", 86)
    assert task.env == "tool" and task.tools == ("calculator",)
    env = make_env(task)
    messages = env.reset(task)
    assert messages[-1]["content"].startswith("What is 347 * 86? Use the calculator tool")
    assert [t["function"]["name"] for t in env.tools] == ["calculator"]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 86"}}\n</tool_call>'
    obs, reward, done, info = env.step(call)
    assert obs == [{"role": "tool", "content": "29842"}] and reward == 0.0 and not done  # 347*86 = 29842
    obs, reward, done, info = env.step("<answer>29842</answer>")
    assert (obs, reward, done) == ([], 1.0, True) and info["num_tool_calls"] == 1


@pytest.mark.parametrize("answer,reward", [("<answer>29842</answer>", 1.0), ("<answer>29843</answer>", 0.0),
                                           ("29842", 0.0), ("<answer>29842", 0.0)])
def test_calculator_final_answer_rewards(answer, reward):
    task = get_task_suite("calculator").make_task(347, "*", 86)
    env = make_env(task)
    env.reset(task)
    obs, r, done, _ = env.step(answer)  # answering without a tool call ends the episode
    assert done and r == reward


def test_calculator_splits():
    splits = get_task_suite("calculator").splits_problems()
    assert not set(splits["train"]) & set(splits["eval"])
    assert len(splits["train"]) + len(splits["eval"]) == 900 * 90  # 100..999 times 10..99
