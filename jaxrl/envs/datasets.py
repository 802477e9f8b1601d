"""Prompt datasets from JSONL or Parquet files, as `Task`s.

One row per task. Fields:

* `prompt` (string, a single user message) **or** `messages` (a list of `{"role", "content"}`
  chat messages, roles system / user / assistant / tool, not ending with an assistant turn);
* `reward_spec` (required): an object (or a JSON string of one) such as
  `{"type": "exact_match", "answer": "42"}`; see `jaxrl.envs.rewards` for the types;
* optional: `system` (a system message put before `prompt`), `env` (default "single_turn"; see
  `jaxrl.envs.verifiable.ENV_REGISTRY`), `tools` (tool names for `env: "tool"`), `id`;
* any other field goes to `Task.metadata`.

Every problem raises `DatasetError` (one line) naming the file, the row (`line N` for JSONL,
1-based as in an editor; `row N` for Parquet, 0-based as in pyarrow / pandas), the field where
there is one, and the fix: a missing or unreadable file, bytes that are not UTF-8 (a UTF-8 byte
order mark at the start is accepted), a line that is not JSON (`NaN` / `Infinity` are not JSON),
a row that is not an object, a `.parquet` file that is not Parquet, an empty file, wrong types.
"""
from __future__ import annotations

import json
import os
from typing import Any

from jaxrl.envs.types import Task
from jaxrl.envs.rewards import validate_reward_spec

_KNOWN = ("prompt", "messages", "system", "reward_spec", "env", "tools", "id")
_ROLES = ("system", "user", "assistant", "tool")


class DatasetError(ValueError):
    """A dataset file or row is invalid; the message names file, row and field."""


def load_tasks(path: str) -> list[Task]:
    """Reads a `.jsonl` or `.parquet` prompt dataset into tasks (module docstring for the fields).

    Raises:
      DatasetError: missing / unreadable file, unsupported extension, bytes that are not UTF-8,
        unparsable line, not a Parquet file, empty file, or an invalid row (module docstring).
    """
    if not os.path.exists(path):
        raise DatasetError(f"{path}: dataset file does not exist; check data.dataset_path")
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: is a directory, not a dataset file; point data.dataset_path at a .jsonl or "
                           ".parquet file")
    try:
        if path.endswith(".jsonl"):
            rows = _read_jsonl(path)
        elif path.endswith(".parquet"):
            rows = _read_parquet(path)
        else:
            raise DatasetError(f"{path}: unsupported dataset format; use a .jsonl or .parquet file")
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the dataset file ({e.strerror or e})") from None
    if not rows:
        raise DatasetError(f"{path}: the dataset has no rows; write one JSON object per line (JSONL) or at "
                           "least one row (Parquet)")
    return [_row_to_task(row, f"{path}: {where}", default_id=f"{os.path.basename(path)}:{where}")
            for where, row in rows]


def _not_json_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _read_jsonl(path: str) -> list[tuple[str, Any]]:
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # UTF-8 byte order mark
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path}: line {lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte "
                                   f"{e.start + 1} of the line); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                rows.append((f"line {lineno}", json.loads(line, parse_constant=_not_json_constant)))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: line {lineno}: not valid JSON ({e.msg}, column {e.colno}); write one "
                                   "JSON object per line") from None
            except ValueError as e:  # NaN / Infinity
                raise DatasetError(f"{path}: line {lineno}: not valid JSON ({e}); use finite numbers or strings") \
                    from None
    return rows


def _read_parquet(path: str) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow; pip install pyarrow (or convert the file to "
                           "JSONL)") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 -- pyarrow raises ArrowInvalid & co. for a file that is not Parquet
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DatasetError(f"{path}: not a readable Parquet file ({first}); write it with pyarrow / pandas "
                           "to_parquet, or use a .jsonl file") from None
    return [(f"row {i}", r) for i, r in enumerate(table.to_pylist())]


def _row_to_task(row: Any, where: str, default_id: str) -> Task:
    from jaxrl.envs.tools import BUILTIN_TOOLS
    from jaxrl.envs.verifiable import ENV_REGISTRY

    if not isinstance(row, dict):
        raise DatasetError(f"{where}: a row must be a JSON object like {{\"prompt\": ..., \"reward_spec\": ...}}, "
                           f"got {type(row).__name__}")
    row = {k: v for k, v in row.items() if v is not None}  # Parquet fills absent fields with null
    has_prompt, has_messages = "prompt" in row, "messages" in row
    if has_prompt == has_messages:
        raise DatasetError(f"{where}: needs exactly one of the fields 'prompt' (a string) or 'messages' "
                           f"(a list of chat messages); found {'both' if has_prompt else 'neither'}")
    if has_prompt:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DatasetError(f"{where}: prompt: must be a non-empty string")
        messages = [{"role": "user", "content": row["prompt"]}]
        if "system" in row:
            if not isinstance(row["system"], str):
                raise DatasetError(f"{where}: system: must be a string")
            messages.insert(0, {"role": "system", "content": row["system"]})
    else:
        if "system" in row:
            raise DatasetError(f"{where}: system: only allowed with 'prompt'; put the system message in 'messages'")
        messages = _check_messages(row["messages"], where)

    if "reward_spec" not in row:
        raise DatasetError(f"{where}: missing field 'reward_spec' (e.g. {{\"type\": \"exact_match\", \"answer\": \"42\"}})")
    spec = row["reward_spec"]
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: reward_spec: not a valid JSON string ({e.msg})") from None
    if isinstance(spec, dict):
        spec = {k: v for k, v in spec.items() if v is not None}
    try:
        validate_reward_spec(spec, where=f"{where}: reward_spec")
    except ValueError as e:
        raise DatasetError(str(e)) from None

    env = row.get("env", "single_turn")
    if env not in ENV_REGISTRY:
        raise DatasetError(f"{where}: env: {env!r} is not registered; registered: {', '.join(sorted(ENV_REGISTRY))}")
    tools = row.get("tools", [])
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, str) for t in tools):
        raise DatasetError(f"{where}: tools: must be a list of tool names")
    unknown = [t for t in tools if t not in BUILTIN_TOOLS]
    if unknown:
        raise DatasetError(f"{where}: tools: unknown tool(s) {unknown}; available: {', '.join(sorted(BUILTIN_TOOLS))}")
    if env == "tool" and not tools:
        raise DatasetError(f"{where}: tools: env 'tool' needs a non-empty list of tool names")
    return Task(messages=messages, reward_spec=spec, env=env, tools=tuple(tools),
                task_id=str(row.get("id", default_id)),
                metadata={k: v for k, v in row.items() if k not in _KNOWN})


def _check_messages(messages: Any, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: messages: must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DatasetError(f"{where}: messages[{i}]: must be an object with 'role' and 'content'")
        for key in ("role", "content"):
            if key not in m or m[key] is None:
                raise DatasetError(f"{where}: messages[{i}].{key}: missing")
        if m["role"] not in _ROLES:
            raise DatasetError(f"{where}: messages[{i}].role: must be one of {', '.join(_ROLES)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise DatasetError(f"{where}: messages[{i}].content: must be a string")
        out.append({k: v for k, v in m.items() if v is not None})
    if out[-1]["role"] == "assistant":
        raise DatasetError(f"{where}: messages[{len(out) - 1}].role: the conversation must not end with an "
                           "assistant turn (the policy answers next)")
    return out
