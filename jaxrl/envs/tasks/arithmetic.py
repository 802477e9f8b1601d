"""Integer arithmetic tasks: the embedded default task and a calculator tool-use task.

Answers are written as `<answer>85</answer>` (scored by the `answer_tag` reward of
`jaxrl.envs.rewards`): a short fixed format a tiny model can learn, with an optional partial
credit (`format_reward`) for a well-formed but wrong answer.

Splits: every problem `(a, op, b)` of the configured ranges goes to the eval split iff
`sha256(f"{split_seed}:{a}{op}{b}")`, read as a fraction in [0, 1), is below `eval_fraction`;
the rest is train. Membership therefore depends only on the problem and `split_seed` (the same
problem is in the same split whatever the operand ranges), and the splits never overlap.
Within a split, problems are ordered by that hash (a fixed pseudo-random order).
"""
from __future__ import annotations

import hashlib
import operator
from typing import Optional

import numpy as np

from jaxrl.envs.types import Task

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
ANSWER_INSTRUCTION = "Answer with the result in <answer></answer> tags."
SPLITS = ("train", "eval")


class TaskSuite:
    """A named collection of tasks with fixed train / eval splits (see `dataset`)."""

    splits = SPLITS

    def dataset(self, split: str, num: Optional[int] = None, seed: Optional[int] = None) -> list[Task]:
        """Tasks of `split` ("train" or "eval").

        Args:
          split: "train" or "eval".
          num: how many (the first `num` after shuffling); None = all.
          seed: if given, the split is shuffled with `np.random.default_rng(seed)` first.
        Raises:
          ValueError: unknown split, or `num` larger than the split.
        """
        raise NotImplementedError


class _EnumeratedArithmetic(TaskSuite):
    """Shared logic: enumerate `(a, op, b)` problems, split them by hash, build `Task`s."""

    name = "arithmetic"

    def __init__(self, ops: str, a_range: tuple[int, int], b_range: tuple[int, int], allow_negative: bool,
                 eval_fraction: float, split_seed: int, format_reward: float):
        bad = [op for op in ops if op not in _OPS]
        if not ops or bad:
            raise ValueError(f"{self.name}: ops must be a non-empty string of {''.join(_OPS)}, got {ops!r}")
        for label, (lo, hi) in (("a_range", a_range), ("b_range", b_range)):
            if not 0 <= lo <= hi:
                raise ValueError(f"{self.name}: {label} must satisfy 0 <= low <= high, got {(lo, hi)}")
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"{self.name}: eval_fraction must be in (0, 1), got {eval_fraction}")
        if not 0.0 <= format_reward < 1.0:
            raise ValueError(f"{self.name}: format_reward must be in [0, 1), got {format_reward}")
        self.ops, self.a_range, self.b_range = ops, tuple(a_range), tuple(b_range)
        self.allow_negative, self.eval_fraction = allow_negative, eval_fraction
        self.split_seed, self.format_reward = split_seed, float(format_reward)
        self._splits: Optional[dict[str, list[tuple[int, str, int]]]] = None

    def _problems(self):
        for op in self.ops:
            for a in range(self.a_range[0], self.a_range[1] + 1):
                for b in range(self.b_range[0], self.b_range[1] + 1):
                    if op == "-" and not self.allow_negative and a < b:
                        continue
                    yield a, op, b

    def split_key(self, a: int, op: str, b: int) -> float:
        """The problem's hash as a fraction in [0, 1) (module docstring)."""
        digest = hashlib.sha256(f"{self.split_seed}:{a}{op}{b}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64

    def splits_problems(self) -> dict[str, list[tuple[int, str, int]]]:
        """`{"train": [(a, op, b), ...], "eval": [...]}` in split order."""
        if self._splits is None:
            keyed = sorted((self.split_key(*p), p) for p in self._problems())
            self._splits = {"train": [p for k, p in keyed if k >= self.eval_fraction],
                            "eval": [p for k, p in keyed if k < self.eval_fraction]}
            if not self._splits["train"] or not self._splits["eval"]:
                raise ValueError(f"{self.name}: the operand ranges are too small for both splits to be non-empty")
        return self._splits

    def dataset(self, split: str, num: Optional[int] = None, seed: Optional[int] = None) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"{self.name}: split must be one of {SPLITS}, got {split!r}")
        pool = self.splits_problems()[split]
        order = np.arange(len(pool)) if seed is None else np.random.default_rng(seed).permutation(len(pool))
        if num is not None:
            if not 0 < num <= len(pool):
                raise ValueError(f"{self.name}: num must be in 1..{len(pool)} for split {split!r}, got {num}")
            order = order[:num]
        return [self.make_task(*pool[i], split=split) for i in order]

    def make_task(self, a: int, op: str, b: int, split: str = "") -> Task:
        raise NotImplementedError

    def _reward_spec(self, a: int, op: str, b: int) -> dict:
        return {"type": "answer_tag", "answer": str(_OPS[op](a, b)), "format_reward": self.format_reward}


class ArithmeticTask(_EnumeratedArithmetic):
    """Single-turn integer arithmetic: "What is 37 + 48?" → `<answer>85</answer>`.

    Args:
      ops: operators to draw from ("+", "-", "*").
      max_operand: operands are 0..max_operand.
      allow_negative: if False, subtraction problems have a >= b.
      eval_fraction: share of problems in the eval split.
      split_seed: seeds the train / eval assignment.
      format_reward: reward of a well-formed wrong answer (0.0 = exact-match only; the registered
        `arithmetic_partial` uses 0.1).
    """

    name = "arithmetic"

    def __init__(self, ops: str = "+-", max_operand: int = 99, allow_negative: bool = False,
                 eval_fraction: float = 0.1, split_seed: int = 0, format_reward: float = 0.0):
        super().__init__(ops, (0, max_operand), (0, max_operand), allow_negative, eval_fraction, split_seed,
                         format_reward)

    def make_task(self, a: int, op: str, b: int, split: str = "") -> Task:
        """The task for `a op b` (system instruction + user question)."""
        return Task(
            messages=[{"role": "system", "content": ANSWER_INSTRUCTION},
                      {"role": "user", "content": f"What is {a} {op} {b}?"}],
            reward_spec=self._reward_spec(a, op, b),
            env="single_turn",
            task_id=f"arithmetic/{a}{op}{b}",
            metadata={"split": split, "a": a, "op": op, "b": b},
        )


class CalculatorTask(_EnumeratedArithmetic):
    """Multi-turn tool use: call the `calculator` tool, read its result, answer `<answer>N</answer>`.

    The environment is `ToolEnv` with the built-in calculator; the reward is on the final answer
    (turns with tool calls get 0). Default problems: 3-digit times 2-digit products.

    Args:
      ops, a_range, b_range, allow_negative, eval_fraction, split_seed, format_reward: as in
        `ArithmeticTask` (a_range / b_range are inclusive operand ranges).
    """

    name = "calculator"

    def __init__(self, ops: str = "*", a_range: tuple[int, int] = (100, 999), b_range: tuple[int, int] = (10, 99),
                 allow_negative: bool = False, eval_fraction: float = 0.1, split_seed: int = 0,
                 format_reward: float = 0.0):
        super().__init__(ops, a_range, b_range, allow_negative, eval_fraction, split_seed, format_reward)

    def make_task(self, a: int, op: str, b: int, split: str = "") -> Task:
        """The task for `a op b` (a user question asking for a calculator call)."""
        return Task(
            messages=[{"role": "user", "content": f"What is {a} {op} {b}? Use the calculator tool, then "
                                                  "answer with the result in <answer></answer> tags."}],
            reward_spec=self._reward_spec(a, op, b),
            env="tool",
            tools=("calculator",),
            task_id=f"calculator/{a}{op}{b}",
            metadata={"split": split, "a": a, "op": op, "b": b},
        )
