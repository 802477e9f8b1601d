"""Harbor task sets for training: a task directory, a folder of tasks, a DCAgent Parquet file, or a
templated family; train / held-out splits; the verifier sanity gate before training.

`data.dataset_path` (and `data.eval_dataset_path`) of a `data.task=harbor` run is one of:

* a task directory, a folder of task directories, or a DCAgent `.parquet` file (`load_task_set`);
  Parquet rows are unpacked under the run's `tasks/` folder;
* `family:<name>:<first>-<last>`: the seeds `first..last` (inclusive) of a templated family of
  `families.py` (e.g. `family:write-file:0-1599`), written under the run's `tasks/` folder. Seeds
  below a family's size are distinct tasks, so disjoint ranges are disjoint splits.

Held-out split: `eval_dataset_path` when given (tasks that also occur in the training set, by name,
are refused); otherwise a `data.eval_fraction` share of `dataset_path`, picked by the split seed
`data.eval_split_seed` from the task names (not by the run's seed), is held out and removed from
training (`split_tasks`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.errors import HarborTaskError
from jaxrl.envs.harbor.families import FAMILIES, generate_tasks
from jaxrl.envs.harbor.task import HarborTask, load_task_set

_FAMILY_RE = re.compile(r"family:([A-Za-z0-9_-]+):(\d+)-(\d+)")


def parse_family_spec(spec: str) -> Optional[tuple[str, range]]:
    """`family:<name>:<first>-<last>` -> (name, range(first, last + 1)); None for anything else.

    Raises:
      HarborTaskError: an unknown family or an empty range.
    """
    if not spec.startswith("family:"):
        return None
    m = _FAMILY_RE.fullmatch(spec.strip())
    if not m:
        raise HarborTaskError(f"{spec!r}: a family spec reads family:<name>:<first>-<last>, e.g. family:write-file:0-1599")
    name, a, b = m.group(1), int(m.group(2)), int(m.group(3))
    if name not in FAMILIES:
        raise HarborTaskError(f"{spec!r}: unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    if b < a:
        raise HarborTaskError(f"{spec!r}: the seed range {a}-{b} is empty; write <first>-<last> with first <= last")
    return name, range(a, b + 1)


def spec_exists(spec: str) -> bool:
    """True when `spec` is a valid family spec or an existing path (for config validation)."""
    try:
        return parse_family_spec(spec) is not None or os.path.exists(spec)
    except HarborTaskError:
        return False


def load_spec(spec: str, tasks_dir: str | os.PathLike, environment_backend: str = "profile") -> list[HarborTask]:
    """The tasks of one `dataset_path` value (module docstring), sorted by name.

    Args:
      spec: a path or a family spec.
      tasks_dir: where family tasks are written and Parquet tasks unpacked (one subfolder per spec).
      environment_backend: `harbor.environment_backend` ("profile" | "image" | "auto", as `load_task`).

    Raises:
      FileNotFoundError: the path does not exist.
      HarborTaskError: an invalid task (naming its path and the missing piece), an invalid spec.
    """
    fam = parse_family_spec(spec)
    key = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(spec.rstrip("/")) if fam is None else spec)[:60]
    out = Path(tasks_dir) / f"{key}-{hashlib.sha256(spec.encode()).hexdigest()[:8]}"
    if fam is not None:
        name, seeds = fam
        if out.exists():  # rewritten every time: the family code is the source of truth
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        generate_tasks(name, seeds, tmp)
        os.replace(tmp, out)
        return load_task_set(out, environment_backend=environment_backend)
    if os.path.isfile(spec):
        return load_task_set(spec, extract_dir=out, environment_backend=environment_backend)
    return load_task_set(spec, environment_backend=environment_backend)


def split_tasks(train_spec: str, eval_spec: str, eval_fraction: float, split_seed: int,
                tasks_dir: str | os.PathLike, environment_backend: str = "profile"
                ) -> tuple[list[HarborTask], list[HarborTask]]:
    """(train tasks, held-out tasks) of a Harbor run (module docstring).

    Args:
      train_spec: `data.dataset_path`.
      eval_spec: `data.eval_dataset_path` ("" = a share of the training set).
      eval_fraction: `data.eval_fraction`: without `eval_spec`, ceil(fraction x n) of the n training
        tasks (at least 1, at most n - 1) are held out; 0 = none.
      split_seed: `data.eval_split_seed`: the held-out tasks are the first of the tasks sorted by
        sha256("<seed>:<task name>") (the rule of `jaxrl.envs.splits.heldout_split`).
      tasks_dir: where family tasks are written and Parquet tasks unpacked.
      environment_backend: `harbor.environment_backend`, as `load_spec`.
    Returns:
      the training tasks sorted by name, and the held-out tasks (sorted by name for `eval_spec`, in
      split order otherwise).
    Raises:
      HarborTaskError: an invalid task or spec, a held-out set overlapping the training set, or a
        training set of one task with a held-out share asked for.
    """
    train = load_spec(train_spec, tasks_dir, environment_backend)
    if eval_spec:
        held = load_spec(eval_spec, tasks_dir, environment_backend)
        overlap = sorted({t.name for t in train} & {t.name for t in held})
        if overlap:
            raise HarborTaskError(f"data.eval_dataset_path {eval_spec!r} shares {len(overlap)} task(s) with "
                                  f"data.dataset_path {train_spec!r} (e.g. {overlap[0]!r}); held-out tasks must not "
                                  "be trained on: use disjoint sets (for a family, disjoint seed ranges)")
        return train, held
    if eval_fraction <= 0:
        return train, []
    if len(train) < 2:
        raise HarborTaskError(f"data.dataset_path {train_spec!r} has {len(train)} task(s); holding out a "
                              f"data.eval_fraction={eval_fraction:g} share leaves none to train on: set "
                              "data.eval_fraction=0 or give data.eval_dataset_path")
    n_eval = min(max(1, math.ceil(eval_fraction * len(train))), len(train) - 1)
    order = sorted(train, key=lambda t: hashlib.sha256(f"{int(split_seed)}:{t.name}".encode()).digest())
    held = order[:n_eval]
    names = {t.name for t in held}
    return [t for t in train if t.name not in names], held


def gate_tasks(tasks: Sequence[HarborTask], cache_path: Optional[str] = None, **check_kwargs
               ) -> tuple[list[HarborTask], list[tuple[str, str]]]:
    """The verifier sanity gate (`check_tasks`: oracle must score 1, the empty agent 0) over
    `tasks`; returns (the tasks that pass, [(name, problems)] of those that fail).

    Args:
      tasks: the tasks to check.
      cache_path: a JSON file of earlier verdicts by task name and content digest (a resumed run
        reuses them; a changed task is checked again); written atomically after the check.
      check_kwargs: passed to `check_tasks` (concurrency, config).
    """
    from jaxrl.envs.harbor.runner import check_tasks
    from jaxrl.fileio import atomic_write_json

    cached: dict = {}
    if cache_path and os.path.exists(cache_path):
        try:
            with open(cache_path) as f:
                cached = json.load(f)
        except (OSError, ValueError):
            cached = {}
    key = lambda t: f"{t.name} {task_digest(t)}"  # noqa: E731
    todo = [t for t in tasks if key(t) not in cached]
    if todo:
        for t, c in zip(todo, check_tasks(todo, **check_kwargs)):
            cached[key(t)] = "; ".join(c.problems)
        if cache_path:
            atomic_write_json(cache_path, cached)
    kept = [t for t in tasks if not cached[key(t)]]
    failed = [(t.name, cached[key(t)]) for t in tasks if cached[key(t)]]
    return kept, failed


def is_task_set(spec: str) -> bool:
    """True when `spec` names a Harbor task set rather than a prompt file: a family spec, a
    directory, or a Parquet file with a `task_binary` column (the DCAgent form)."""
    if spec.startswith("family:"):
        return True
    if os.path.isdir(spec):
        return True
    if os.path.isfile(spec) and spec.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq

            return "task_binary" in pq.read_schema(spec).names
        except Exception:  # noqa: BLE001 - not readable as Parquet: the prompt loader reports it
            return False
    return False


def task_digest(task: HarborTask) -> str:
    """sha256 (16 hex digits) of every file of a task directory: relative paths and bytes, in order
    (symbolic links by their target)."""
    h = hashlib.sha256()
    root = Path(task.path)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:16]
