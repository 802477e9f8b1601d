"""The prompt source: the train prompts of each RL step and the fixed held-out eval prompts.

Every choice derives from (`seed`, step): a built-in task suite draws step s's prompts with
seed `derive_seed(seed, s, 1)`; a dataset is walked in per-epoch permutations, so prompt k of the
run (k = (s - 1) * train_batch_size + i) is entry k % n of epoch k // n's permutation. A resumed
run therefore sees the same prompts without storing an iterator.
"""
from __future__ import annotations

import hashlib

import numpy as np

from jaxrl.envs import get_task_suite, load_tasks


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (stable across processes and Python versions)."""
    h = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class PromptSource:
    """Train prompts per step (deterministic in (seed, step)) and the fixed held-out eval prompts."""

    def __init__(self, c):
        self.c = c
        self._orders: dict[int, np.ndarray] = {}
        if c.data.task == "dataset":
            self.train_tasks = load_tasks(c.data.dataset_path)
            self.suite = None
        else:
            self.suite = get_task_suite(c.data.task)
        eval_name = c.data.eval_task or (c.data.task if self.suite else "")
        self.eval_suite = get_task_suite(eval_name) if eval_name else None

    def train_batch(self, step: int):
        """The `train_batch_size` tasks of RL step `step` (1-based)."""
        c = self.c
        seed = derive_seed(c.seed, step, 1)
        if self.suite is not None:
            return self.suite.dataset("train", num=c.trainer.train_batch_size, seed=seed)
        # Prompt k of the run (k = (step - 1) * B + i) is entry k % n of epoch k // n's permutation.
        n, B = len(self.train_tasks), c.trainer.train_batch_size
        out = []
        for k in range((step - 1) * B, step * B):
            epoch, within = divmod(k, n)
            if epoch not in self._orders:
                self._orders = {epoch: np.random.default_rng(derive_seed(c.seed, epoch, 2)).permutation(n)}
            out.append(self.train_tasks[self._orders[epoch][within]])
        return out

    def eval_batch(self):
        """The held-out tasks ([] when there is no eval task or `data.num_eval_prompts` is 0)."""
        if self.eval_suite is None or self.c.data.num_eval_prompts == 0:
            return []
        return self.eval_suite.dataset("eval", num=self.c.data.num_eval_prompts, seed=derive_seed(self.c.seed, 7))
