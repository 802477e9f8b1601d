"""Prompt datasets from JSONL and Parquet: parsing, errors naming file / row / field, end-to-end rollout."""
import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs_fakes import ScriptedGenerator
from jaxrl.envs import (ChatTemplate, DEFAULT_POLICY_DIR, DatasetError, RolloutConfig, load_tasks, run_rollouts)
from jaxrl.rollout.types import SamplingParams

ROWS = [
    {"prompt": "What is 6 * 7?", "reward_spec": {"type": "exact_match", "answer": "42"}, "id": "q1", "source": "hand"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
     "reward_spec": {"type": "exact_match", "answer": "Paris"}},
    {"prompt": "Use the calculator: 12 * 12", "system": "You can call tools.", "env": "tool", "tools": ["calculator"],
     "reward_spec": {"type": "numeric", "answer": "144"}},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path, rows):
    keys = list(dict.fromkeys(k for r in rows for k in r))  # absent fields become nulls, as in real files
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), str(path))
    return str(path)


def check_rows(tasks, path):
    assert len(tasks) == 3
    t0, t1, t2 = tasks
    assert t0.messages == [{"role": "user", "content": "What is 6 * 7?"}]
    assert t0.reward_spec == {"type": "exact_match", "answer": "42"}
    assert (t0.env, t0.tools, t0.task_id, t0.metadata) == ("single_turn", (), "q1", {"source": "hand"})
    assert t1.messages == ROWS[1]["messages"] and t1.reward_spec["answer"] == "Paris"
    assert t2.messages == [{"role": "system", "content": "You can call tools."},
                           {"role": "user", "content": "Use the calculator: 12 * 12"}]
    assert (t2.env, t2.tools) == ("tool", ("calculator",))
    assert t2.reward_spec == {"type": "numeric", "answer": "144"}
    assert path.split("/")[-1] in t1.task_id


def test_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    check_rows(load_tasks(path), path)


def test_parquet(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", ROWS)
    check_rows(load_tasks(path), path)


def test_parquet_reward_spec_as_json_string(tmp_path):
    rows = [{"prompt": "p", "reward_spec": json.dumps({"type": "exact_match", "answer": "1"})}]
    (t,) = load_tasks(write_parquet(tmp_path / "s.parquet", rows))
    assert t.reward_spec == {"type": "exact_match", "answer": "1"}


BAD = [
    ({"prompt": "x"}, "missing field 'reward_spec'"),
    ({"reward_spec": {"type": "exact_match", "answer": "1"}}, "exactly one of the fields 'prompt'"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}], "reward_spec": {"type": "exact_match", "answer": "1"}},
     "found both"),
    ({"messages": [{"role": "user", "content": "x"}, {"content": "y"}], "reward_spec": {"type": "exact_match", "answer": "1"}},
     r"messages\[1\]\.role: missing"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
      "reward_spec": {"type": "exact_match", "answer": "1"}}, r"messages\[1\]\.role: the conversation must not end"),
    ({"prompt": "x", "reward_spec": {"type": "exact_match"}}, r"reward_spec\.answer: missing"),
    ({"prompt": "x", "reward_spec": {"type": "regex", "answer": "1"}}, r"reward_spec\.type: must be one of"),
    ({"prompt": "x", "reward_spec": {"type": "exact_match", "answer": "1"}, "env": "chess"}, "env: 'chess' is not registered"),
    ({"prompt": "x", "reward_spec": {"type": "exact_match", "answer": "1"}, "env": "tool", "tools": ["web"]},
     r"tools: unknown tool\(s\) \['web'\]; available: calculator"),
]


@pytest.mark.parametrize("row,message", BAD)
def test_jsonl_errors_name_file_line_and_field(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], row])
    with pytest.raises(DatasetError) as e:
        load_tasks(path)
    assert str(e.value).startswith(f"{path}: line 2: ")
    assert re.search(message, str(e.value)), str(e.value)


def test_parquet_error_names_file_row_and_field(tmp_path):
    rows = [ROWS[0], {"prompt": "no spec", "reward_spec": None}]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DatasetError, match=re.escape(f"{path}: row 1: missing field 'reward_spec'")):
        load_tasks(path)
    rows = [ROWS[0], {"prompt": "x", "reward_spec": {"type": "exact_match", "answer": None}}]
    path = write_parquet(tmp_path / "bad2.parquet", rows)
    with pytest.raises(DatasetError, match=re.escape(f"{path}: row 1: reward_spec.answer: missing")):
        load_tasks(path)


def test_file_level_errors(tmp_path):
    with pytest.raises(DatasetError, match=re.escape(f"{tmp_path / 'none.jsonl'}: dataset file does not exist")):
        load_tasks(str(tmp_path / "none.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"d\.csv: unsupported dataset format"):
        load_tasks(str(tmp_path / "d.csv"))
    p = tmp_path / "broken.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n")
    with pytest.raises(DatasetError, match=re.escape(f"{p}: line 3: not valid JSON")):
        load_tasks(str(p))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no rows"):
        load_tasks(str(tmp_path / "empty.jsonl"))


def _one_line_error(path):
    with pytest.raises(DatasetError) as e:
        load_tasks(str(path))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg[len(str(path)) + 2:]


def test_bad_bytes_and_bad_files_give_one_line_errors(tmp_path):
    """Issue 9 §8: each names the file and the line / row and says what to do; never a traceback."""
    good = (json.dumps(ROWS[0]) + "\n").encode()
    cases = {
        # Latin-1 "é" (0xe9) in line 2: not UTF-8.
        "latin1.jsonl": (good + b'{"prompt": "caf\xe9", "reward_spec": {"type": "exact_match", "answer": "1"}}\n',
                         "line 2: not valid UTF-8 (byte 0xe9 at byte 16 of the line); save the file as UTF-8"),
        "nan.jsonl": (good + b'{"prompt": "x", "reward_spec": {"type": "numeric", "answer": "1", "tolerance": NaN}}\n',
                      "line 2: not valid JSON (NaN is not JSON); use finite numbers or strings"),
        "list.jsonl": (good + b'["prompt", "x"]\n', "line 2: a row must be a JSON object like"),
        "string.jsonl": (b'"just a string"\n', "line 1: a row must be a JSON object like"),
        "empty.jsonl": (b"", "the dataset has no rows; write one JSON object per line"),
        "types.jsonl": (good + b'{"prompt": 7, "reward_spec": {"type": "exact_match", "answer": "1"}}\n',
                        "line 2: prompt: must be a non-empty string"),
        "spec.jsonl": (good + b'{"prompt": "x", "reward_spec": {"type": "numeric", "answer": "1", "tolerance": 1e999}}\n',
                       "line 2: reward_spec.tolerance: must be a finite number, got inf"),
        "fake.parquet": (good, "not a readable Parquet file ("),
        "empty.parquet": (b"", "not a readable Parquet file ("),
    }
    for name, (data, expected) in cases.items():
        (tmp_path / name).write_bytes(data)
        msg = _one_line_error(tmp_path / name)
        assert msg.startswith(expected), (name, msg)
    # A UTF-8 byte order mark (Windows editors) is not an error.
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + good)
    assert load_tasks(str(tmp_path / "bom.jsonl"))[0].messages == [{"role": "user", "content": "What is 6 * 7?"}]
    os.makedirs(tmp_path / "dir.jsonl")
    assert _one_line_error(tmp_path / "dir.jsonl").startswith("is a directory, not a dataset file")


def test_dataset_rollout_end_to_end(tmp_path):
    chat = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR)
    tasks = load_tasks(write_jsonl(tmp_path / "d.jsonl", ROWS))

    def policy(prompt, j):
        if "Capital" in prompt:
            return "Paris"
        if "calculator" in prompt and "<tool_response>" not in prompt:
            return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 12"}}\n</tool_call>'
        if "<tool_response>" in prompt:
            return "It is 144."
        return "<answer>41</answer>"

    trajs = run_rollouts(ScriptedGenerator(chat, policy), chat, tasks, SamplingParams(), RolloutConfig(max_turns=2))
    assert [t.reward for t in trajs] == [0.0, 1.0, 1.0]
    assert [t.num_turns for t in trajs] == [1, 1, 2]
