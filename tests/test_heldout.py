"""Held-out evaluation of dataset runs: the seeded disjoint split of the training file
(`data.eval_fraction`) and an evaluation file (`data.eval_dataset_path`)."""
import hashlib
import json
import math

import pytest

from jaxrl.envs import Task
from jaxrl.envs.splits import heldout_split, overlap


def _task(q, answer="1", system=None):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
    return Task(messages=messages, reward_spec={"type": "exact_match", "answer": answer}, task_id=q)


def test_split_is_disjoint_by_prompt_sized_by_fraction_and_seeded():
    tasks = [_task(f"q{i}") for i in range(40)] + [_task("q3", answer="other"), _task("q7")]  # repeated prompts
    train, held = heldout_split(tasks, 0.1, seed=0)
    held_q = {t.messages[-1]["content"] for t in held}
    train_q = {t.messages[-1]["content"] for t in train}
    assert not held_q & train_q and held_q | train_q == {f"q{i}" for i in range(40)}
    assert len(held_q) == math.ceil(0.1 * 40) == 4
    assert len(train) + len(held) == len(tasks)  # every row on one side, copies together
    # The rule, computed here: the 4 prompts with the smallest sha256(f"{seed}:{key}").
    key = lambda q: json.dumps({"messages": [{"role": "user", "content": q}], "tools": []}, sort_keys=True)
    by_hash = sorted((f"q{i}" for i in range(40)), key=lambda q: hashlib.sha256(f"0:{key(q)}".encode()).digest())
    assert [t.messages[-1]["content"] for t in held if t.reward_spec["answer"] == "1"] == [
        q for q in by_hash[:4] for _ in range(1 + (q == "q7"))]
    # Row order and the run's seed do not matter; the split seed does.
    assert {t.task_id for t in heldout_split(tasks[::-1], 0.1, seed=0)[1]} == {t.task_id for t in held}
    assert {t.task_id for t in heldout_split(tasks, 0.1, seed=1)[1]} != {t.task_id for t in held}
    assert [t.task_id for t in train] == [t.task_id for t in tasks if t.task_id not in {h.task_id for h in held}]


def test_split_keeps_one_prompt_on_each_side_and_rejects_bad_input():
    two = [_task("a"), _task("b")]
    train, held = heldout_split(two, 0.9, seed=0)
    assert len(train) == 1 and len(held) == 1
    train, held = heldout_split([_task(f"q{i}") for i in range(10)], 0.01, seed=0)
    assert len(held) == 1
    with pytest.raises(ValueError, match="at least 2"):
        heldout_split([_task("a"), _task("a")], 0.5, seed=0)
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        heldout_split(two, 0.0, seed=0)
    assert overlap([_task("a"), _task("c")], two) == 1


def test_a_one_prompt_dataset_is_one_error_line_naming_the_fix(tmp_path, monkeypatch, capsys):
    """Regression (fresh-user review): a one-row JSONL with the default eval_fraction ended in a
    ValueError traceback from the split; it is now one `error:` line, exit 2, naming the keys to set.
    (jaxrl.main's `main` in process: tests/main_in_process.py.)"""
    from main_in_process import recipe, run_main

    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1+1?", "reward_spec": {"type": "exact_match", "answer": "2"}}) + "\n")
    c = recipe("configs/rloo.py", **{"data.task": "dataset", "data.dataset_path": str(data)})
    code, err = run_main(monkeypatch, capsys, c, tmp_path / "run")
    assert code == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: data.dataset_path"), err[-2000:]
    assert "1 distinct prompt" in lines[0] and "data.eval_dataset_path" in lines[0] and "data.eval_fraction=0" in lines[0]
