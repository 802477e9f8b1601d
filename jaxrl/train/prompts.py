"""The prompt source: the train prompts of each RL step and the fixed held-out eval prompts
(`PromptSource` says which held-out set a config gets).

Every choice derives from (`seed`, step): a built-in task suite draws step s's prompts with
seed `derive_seed(seed, s, 1)`; a dataset is walked in per-epoch permutations, so prompt k of the
run (k = (s - 1) * train_batch_size + i) is entry k % n of epoch k // n's permutation. A resumed
run therefore sees the same prompts without storing an iterator.
"""
from __future__ import annotations

import hashlib

import numpy as np

from jaxrl.envs import DatasetError, get_task_suite, load_tasks
from jaxrl.envs.chat import PromptFormat
from jaxrl.envs.splits import heldout_split, overlap


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (stable across processes and Python versions)."""
    h = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def training_prompt_format(c) -> PromptFormat:
    """The training prompt format of a run config (a ConfigDict, or the dict of a run's
    rl_config.json): the training prompts of `data.task` (the train split of a built-in task,
    or every row of `data.dataset_path`; Harbor task sets have no system prompt and no tools)
    and `generator.enable_thinking`.

    Raises:
      ValueError: the config names no task, or an unknown one.
      DatasetError: the dataset file cannot be read (the message names it).
    """
    data = c["data"]
    thinking = bool(c["generator"]["enable_thinking"])
    from jaxrl.envs.harbor.dataset import is_task_set

    if data["task"] == "harbor" or (data["task"] == "dataset" and is_task_set(data["dataset_path"])):
        return PromptFormat(None, thinking, 0, ())  # Harbor tasks: one user message, no system prompt, no tools
    if data["task"] == "dataset":
        tasks = load_tasks(data["dataset_path"])
    else:
        tasks = get_task_suite(data["task"]).dataset("train")
    return PromptFormat.of_tasks(tasks, thinking)


class PromptSource:
    """Train prompts per step (deterministic in (seed, step)) and the fixed held-out eval prompts.

    The held-out set, the first that applies:
    1. `data.eval_dataset_path`: the tasks of that file (its row order);
    2. `data.eval_task`: the eval split of that built-in task;
    3. a built-in `data.task`: its own eval split (disjoint from its train split);
    4. `data.task=dataset` with `data.eval_fraction` > 0: a seeded, disjoint share of the training
       file's prompts (`jaxrl.envs.splits.heldout_split` with `data.eval_split_seed`), which is
       then left out of training;
    5. none (`heldout_kind` is "").
    A run on Harbor terminal tasks (`jaxrl.train.harbor.is_harbor_run`) takes both sets from
    `jaxrl.train.harbor.HarborTasks` (the same rules 1 and 4, on task directories).
    `eval_batch()` evaluates the first `data.num_eval_prompts` of it: a built-in split shuffled
    with `derive_seed(seed, 7)`; a file's held-out tasks all if there are fewer.

    Args:
      c: the run config.
      load_train: read the training file of a dataset run (False: only what the held-out set
        needs, e.g. for `jaxrl.evaluate` with an evaluation file).
    Raises:
      DatasetError: a file cannot be read (the message names it); ValueError: a split that
        cannot be made (fewer than 2 distinct prompts).
    """

    def __init__(self, c, load_train: bool = True):
        self.c = c
        self._orders: dict[int, np.ndarray] = {}
        self.suite = None
        self.train_tasks: list = []
        self.heldout_tasks: list = []
        self.eval_suite = None
        d = c.data
        self.harbor = None  # jaxrl.train.harbor.HarborTasks of a run on Harbor terminal tasks
        from jaxrl.train import harbor as harbor_run

        if harbor_run.is_harbor_run(c):
            self.harbor = harbor_run.HarborTasks(c)
            self._use_harbor_lists()
            return
        if d.task == "dataset":
            if load_train or not d.eval_dataset_path and not d.eval_task:
                self.train_tasks = load_tasks(d.dataset_path)
        else:
            self.suite = get_task_suite(d.task)
        if d.eval_dataset_path:
            self.heldout_tasks = load_tasks(d.eval_dataset_path)
            self.heldout_kind = f"data.eval_dataset_path ({d.eval_dataset_path})"
        elif d.eval_task or self.suite is not None:
            name = d.eval_task or d.task
            self.eval_suite = get_task_suite(name)
            self.heldout_kind = f"the eval split of the {name} task"
        elif d.eval_fraction > 0:
            try:
                self.train_tasks, self.heldout_tasks = heldout_split(self.train_tasks, d.eval_fraction,
                                                                     d.eval_split_seed)
            except ValueError as e:  # e.g. a one-prompt file: one line naming the keys, not a traceback
                raise DatasetError(f"data.dataset_path ({d.dataset_path}): {e}; give a held-out file with "
                                   "data.eval_dataset_path, or turn held-out evaluation off with "
                                   "data.eval_fraction=0 (or data.num_eval_prompts=0)") from None
            self.heldout_kind = (f"{100 * d.eval_fraction:g}% of data.dataset_path held out (split seed "
                                 f"{d.eval_split_seed})")
        else:
            self.heldout_kind = ""
        if self.eval_suite is not None and d.num_eval_prompts > 0:
            # More held-out prompts than the eval split holds: stop now, before the run directory
            # is written (was a traceback at the first evaluation, with the bad config committed).
            try:
                self.eval_batch()
            except ValueError as e:
                from jaxrl.config import ConfigError

                raise ConfigError("data.num_eval_prompts", f"{d.num_eval_prompts} held-out prompts asked of "
                                  f"{self.heldout_kind}, which it cannot give ({e})",
                                  "use at most the split's size (the largest num above)") from None

    def _use_harbor_lists(self) -> None:
        self.train_tasks, self.heldout_tasks = self.harbor.train_tasks, self.harbor.eval_tasks
        self.heldout_kind = self.harbor.heldout_kind

    def gate(self, workdir: str) -> list[str]:
        """Harbor runs: the verifier sanity gate (`HarborTasks.gate`) drops failing tasks from the
        training and held-out sets; returns one line per excluded task."""
        lines = self.harbor.gate(workdir)
        self._use_harbor_lists()
        return lines

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

    def overlap_warning(self) -> str:
        """A warning line when held-out prompts of `data.eval_dataset_path` also occur in the
        training file (held-out success then overstates generalisation); "" otherwise."""
        if not self.c.data.eval_dataset_path or not self.train_tasks:
            return ""
        k = overlap(self.heldout_tasks, self.train_tasks)
        if not k:
            return ""
        return (f"jaxrl: warning: {k} of the {len(self.heldout_tasks)} held-out prompts in data.eval_dataset_path "
                f"({self.c.data.eval_dataset_path}) also occur in data.dataset_path; their held-out success is "
                "measured on prompts the policy trains on")

    def training_tasks(self) -> list:
        """Every task the run trains on: the train split of a built-in task, or the training file
        without its held-out share."""
        return self.suite.dataset("train") if self.suite is not None else list(self.train_tasks)

    def eval_batch(self):
        """The held-out tasks evaluated ([] when there is no held-out set or `data.num_eval_prompts` is 0)."""
        num = self.c.data.num_eval_prompts
        if num == 0:
            return []
        if self.eval_suite is not None:
            return self.eval_suite.dataset("eval", num=num, seed=derive_seed(self.c.seed, 7))
        return list(self.heldout_tasks[:num])
