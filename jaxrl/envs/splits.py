"""A seeded, disjoint held-out split of a prompt dataset (`data.eval_fraction`).

Rows are grouped by their prompt (the messages and tool names, not the reward spec), so every
copy of a prompt lands on the same side: no held-out prompt is ever trained on, even when the
file repeats it. The distinct prompts are ordered by `sha256(f"{seed}:{prompt}")` and the first
`ceil(fraction x number of distinct prompts)` are held out (at least one, and at least one is
left to train on). Membership depends only on the file's set of distinct prompts, the fraction and
the split seed: reordering or duplicating rows, or changing the run's `seed`, moves no prompt across.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Sequence

from jaxrl.envs.types import Task


def prompt_key(task: Task) -> str:
    """The identity of a task's prompt: its messages and tool names as canonical JSON."""
    return json.dumps({"messages": task.messages, "tools": list(task.tools or ())}, sort_keys=True,
                      ensure_ascii=False)


def heldout_split(tasks: Sequence[Task], fraction: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, held_out) tasks of a dataset; module docstring for the rule.

    Args:
      tasks: the dataset's tasks, in file order.
      fraction: share of the distinct prompts held out, in (0, 1).
      seed: the split seed (`data.eval_split_seed`).
    Returns:
      the training tasks in file order, and the held-out tasks in split order (sha256 order of
      their prompts; copies of one prompt together, in file order).
    Raises:
      ValueError: `fraction` outside (0, 1), or fewer than 2 distinct prompts (nothing would be
        left on one side).
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"eval fraction must be in (0, 1), got {fraction}")
    keys = [prompt_key(t) for t in tasks]
    distinct = sorted(set(keys), key=lambda k: hashlib.sha256(f"{int(seed)}:{k}".encode()).digest())
    if len(distinct) < 2:
        raise ValueError(f"the dataset has {len(distinct)} distinct prompt(s); a held-out split needs at least 2")
    n_eval = min(max(1, math.ceil(fraction * len(distinct))), len(distinct) - 1)
    rank = {k: i for i, k in enumerate(distinct[:n_eval])}
    train = [t for t, k in zip(tasks, keys) if k not in rank]
    held = sorted((t for t, k in zip(tasks, keys) if k in rank), key=lambda t: rank[prompt_key(t)])
    return train, held


def overlap(a: Sequence[Task], b: Sequence[Task]) -> int:
    """How many tasks of `a` have a prompt that also occurs in `b`."""
    keys = {prompt_key(t) for t in b}
    return sum(prompt_key(t) in keys for t in a)
