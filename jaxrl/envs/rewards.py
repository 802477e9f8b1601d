"""Verifiable rewards, described by a JSON-able spec (one per task or dataset row).

Specs (`type` selects the rule; all compare against the assistant's final content, thinking removed):

* `{"type": "exact_match", "answer": "42"}` — 1.0 if the extracted answer equals `answer` after
  stripping surrounding whitespace, else 0.0. The extracted answer is the content of the last
  `<answer>...</answer>` block when there is one, else the whole response.
* `{"type": "numeric", "answer": "42", "tolerance": 0.0}` — 1.0 if the extracted number is within
  `tolerance` (absolute) of `answer`. The number is the `<answer>` content if present, else the
  last number in the response; no number gives 0.0.
* `{"type": "answer_tag", "answer": "42", "format_reward": 0.1}` — the built-in arithmetic reward:
  1.0 if the response contains exactly one non-empty `<answer>...</answer>` block whose content
  equals `answer` (as numbers when both parse as numbers, else as stripped strings);
  `format_reward` if it contains exactly one such block with a wrong answer (partial credit for the
  format, default 0.0); 0.0 otherwise (no block, several blocks, empty block).
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping, Optional

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

_FIELDS = {
    "exact_match": {"answer": str},
    "numeric": {"answer": (str, int, float), "tolerance": (int, float)},
    "answer_tag": {"answer": (str, int), "format_reward": (int, float)},
}
_REQUIRED = {"exact_match": ("answer",), "numeric": ("answer",), "answer_tag": ("answer",)}
REWARD_TYPES = tuple(_FIELDS)


def extract_answer(text: str) -> Optional[str]:
    """Content of the last `<answer>...</answer>` block, stripped; None if there is none."""
    found = ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def _to_number(text: str) -> Optional[float]:
    text = text.strip().replace(",", "")
    if not _NUMBER_RE.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def validate_reward_spec(spec: Any, where: str = "reward_spec") -> None:
    """Checks a reward spec; raises ValueError naming `where.<field>` and the fix.

    Args:
      spec: the spec dict.
      where: how the caller names the spec in the message (e.g. "data.jsonl: line 3: reward_spec").
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: must be an object like {{\"type\": \"exact_match\", \"answer\": \"42\"}}, "
                         f"got {type(spec).__name__}")
    kind = spec.get("type")
    if kind not in _FIELDS:
        raise ValueError(f"{where}.type: must be one of {', '.join(REWARD_TYPES)}, got {kind!r}")
    for key in _REQUIRED[kind]:
        if key not in spec or spec[key] is None:
            raise ValueError(f"{where}.{key}: missing (required for type {kind!r})")
    for key, value in spec.items():
        if key == "type" or value is None:
            continue
        if key not in _FIELDS[kind]:
            raise ValueError(f"{where}.{key}: unknown field for type {kind!r}; allowed: {', '.join(_FIELDS[kind])}")
        if isinstance(value, bool) or not isinstance(value, _FIELDS[kind][key]):
            raise ValueError(f"{where}.{key}: wrong type {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}.{key}: must be a finite number, got {value}")
    if kind == "numeric":
        if _to_number(str(spec["answer"])) is None:
            raise ValueError(f"{where}.answer: {spec['answer']!r} is not a number")
        if spec.get("tolerance", 0.0) < 0:
            raise ValueError(f"{where}.tolerance: must be >= 0")
    if kind == "answer_tag" and not 0.0 <= spec.get("format_reward", 0.0) < 1.0:
        raise ValueError(f"{where}.format_reward: must be in [0, 1)")


def compute_reward(spec: Mapping[str, Any], response: str) -> float:
    """Reward in [0, 1] of `response` (the assistant's final content) under `spec` (module docstring).

    Raises:
      ValueError: invalid spec (see `validate_reward_spec`).
    """
    validate_reward_spec(spec)
    spec = {k: v for k, v in spec.items() if v is not None}  # None = absent (Parquet struct columns)
    kind = spec["type"]
    answer = str(spec["answer"]).strip()
    if kind == "exact_match":
        got = extract_answer(response)
        got = response.strip() if got is None else got
        return 1.0 if got == answer else 0.0
    if kind == "numeric":
        got = extract_answer(response)
        if got is None:
            numbers = _NUMBER_RE.findall(response)
            got = numbers[-1] if numbers else ""
        value = _to_number(got)
        if value is None:
            return 0.0
        return 1.0 if abs(value - _to_number(answer)) <= float(spec.get("tolerance", 0.0)) else 0.0
    # answer_tag
    blocks = [b.strip() for b in ANSWER_RE.findall(response)]
    if len(blocks) != 1 or not blocks[0]:
        return 0.0
    got = blocks[0]
    got_num, want_num = _to_number(got), _to_number(answer)
    correct = got_num == want_num if (got_num is not None and want_num is not None) else got == answer
    return 1.0 if correct else float(spec.get("format_reward", 0.0))
