"""Training checkpoints (Orbax): params, optimizer state and the trainer state, committed atomically.

Layout: `workdir/checkpoints/<step>/{params, opt_state, trainer_state}` written by an Orbax
`CheckpointManager`. Orbax writes each step into a temporary directory and renames it when
complete, so a run killed mid-save leaves the previous step as the latest committed one.

Retention has ONE source of truth, the trainer: Orbax keeps every step, and `prune(protect)`
deletes all but the last `max_to_keep` steps and the `protect`ed ones (the trainer passes the
best checkpoint it records in `trainer_state`). So the step the trainer calls best is on disk
after ties, restarts and rollbacks (a retention policy of Orbax's own, deciding by a metric the
trainer does not control, deleted it: issue 9 §2).

`trainer_state` is JSON: step, data-iterator position, reward-EMA state, policy version,
learning-rate scale, rollbacks, the best checkpoint — everything a resumed run needs to continue
exactly (all randomness derives from the seed and the step, so no RNG state is needed).
"""
from __future__ import annotations

import contextlib
import gc
import os
import sys
import types
from typing import Any, Iterable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

CHECKSUMS_KEY = "_checksums"  # in the trainer_state JSON: {item name: per-array checksums} (`tree_checksums`)


class ChecksumMismatch(ValueError):
    """A restored item's arrays differ from the checksums saved with them, or (a checkpoint written before
    checksums) hold NaN/inf values: files damaged without a read error (flipped bytes, same size)."""


def _as_uint32(x):
    """`x`'s bit patterns as uint32 values (64-bit items: two words each; 8- and 16-bit ones zero-extended)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if x.dtype.itemsize >= 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")).astype(jnp.uint32)


@jax.jit
def _checksums_and_finite(leaves):
    sums = [jnp.sum(_as_uint32(x), dtype=jnp.uint32) for x in leaves]  # wraps mod 2**32: exact in any order
    finite = [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    return sums, jnp.all(jnp.stack(finite)) if finite else jnp.array(True)


def _host_scalar(x) -> np.ndarray:
    return np.asarray(x.addressable_shards[0].data)  # replicated: every process holds the value


def tree_checksums(tree) -> tuple[list[int], bool]:
    """(one checksum per array leaf of `tree`, whether every floating-point value is finite).

    A checksum is the sum of the array's bit patterns as uint32 words modulo 2**32: exact and
    independent of the summation order, so the same values give the same checksum on any mesh or
    sharding, and any single flipped bit changes it. Runs on the arrays' devices (one jitted
    reduction per array; collective across processes for sharded arrays: call it on every process)."""
    leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, "dtype")]
    if not leaves:
        return [], True
    sums, finite = _checksums_and_finite(leaves)
    return [int(_host_scalar(v)) for v in sums], bool(_host_scalar(finite))


def verify_checksums(step: int, name: str, tree, saved: Optional[dict]) -> None:
    """Raises `ChecksumMismatch` when `tree` (item `name` of checkpoint `step`, just restored) does not
    match its checksums in `saved` (the `CHECKSUMS_KEY` dict of the step's trainer state), or, for a
    checkpoint without checksums (`saved` None: written before they were), holds NaN/inf values."""
    saved = None if saved is None else saved.get(name)
    sums, finite = tree_checksums(tree)
    if saved is None:
        if not finite:
            raise ChecksumMismatch(f"checkpoint {step}: {name} hold NaN/inf values")
        return
    if len(saved) != len(sums):
        raise ChecksumMismatch(f"checkpoint {step}: {name} has {len(sums)} arrays, its checksums {len(saved)}")
    bad = sum(int(a) != int(b) for a, b in zip(sums, saved))
    if bad:
        raise ChecksumMismatch(f"checkpoint {step}: {bad} of {len(sums)} {name} arrays differ from the checksums "
                               "saved with them (the files were changed after the save)")


class CheckpointStore:
    """Saves and restores training state under `workdir/checkpoints`.

    Args:
      workdir: the run directory.
      max_to_keep: the most recent steps `prune` keeps (protected steps are kept in addition).
      async_save: write in a background thread (call `wait()` before reading the files).
      extra_items: names of further pytrees saved with every step (e.g. "critic": the value
        model's params and optimizer state); `save(..., extras=)` must then give each of them.
    """

    def __init__(self, workdir: str, max_to_keep: int = 2, async_save: bool = True, extra_items=()):
        if max_to_keep < 1:
            raise ValueError(f"CheckpointStore: max_to_keep must be >= 1, got {max_to_keep}")
        self.workdir = os.path.abspath(workdir)
        self.directory = os.path.join(self.workdir, "checkpoints")
        self.max_to_keep = int(max_to_keep)
        self._async = async_save
        self.extra_items = tuple(extra_items)
        self.manager = self._open()

    def _open(self) -> ocp.CheckpointManager:
        options = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=self._async, create=True)
        return ocp.CheckpointManager(self.directory, options=options,
                                     item_names=("params", "opt_state", "trainer_state") + self.extra_items)

    def latest_step(self) -> Optional[int]:
        """The newest committed step, or None when there is none."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Committed steps, ascending."""
        return sorted(self.manager.all_steps())

    def save(self, step: int, params: Any, opt_state: Any, trainer_state: dict[str, Any],
             extras: Optional[dict[str, Any]] = None) -> None:
        """Starts saving one step (returns before the write finishes when async).

        Args:
          step: RL step number (the directory name).
          params, opt_state: pytrees of jax arrays (sharded arrays are written shard by shard).
          trainer_state: JSON-serializable dict.
          extras: {name: pytree} for every name of `extra_items` (committed with the step).
        Raises:
          ValueError: extras do not match `extra_items`.
        """
        extras = extras or {}
        if set(extras) != set(self.extra_items):
            raise ValueError(f"CheckpointStore.save: extras {sorted(extras)} do not match extra_items "
                             f"{sorted(self.extra_items)}")
        if jax.process_index() == 0:  # a checkpoint that cannot fit fails before Orbax starts writing
            from jaxrl.fileio import require_free_space, tree_nbytes

            size = tree_nbytes(params) + tree_nbytes(opt_state) + sum(tree_nbytes(t) for t in extras.values())
            require_free_space(self.directory, size, f"checkpoint of step {step}")
        trees = {"params": params, "opt_state": opt_state, **extras}
        trainer_state = {**trainer_state, CHECKSUMS_KEY: {k: tree_checksums(t)[0] for k, t in trees.items()}}
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                trainer_state=ocp.args.JsonSave(trainer_state),
                **{name: ocp.args.StandardSave(tree) for name, tree in extras.items()},
            ),
        )

    def wait(self) -> None:
        """Blocks until any pending asynchronous save is committed."""
        self.manager.wait_until_finished()

    def prune(self, protect: Iterable[int] = ()) -> list[int]:
        """Deletes committed steps other than the last `max_to_keep` and the `protect`ed ones.

        Call it after `wait()`, on every process (Orbax deletes collectively). Returns the
        deleted steps.
        """
        self.wait()
        steps = self.all_steps()
        keep = set(steps[-self.max_to_keep:]) | {int(s) for s in protect}
        deleted = [s for s in steps if s not in keep]
        for s in deleted:
            self.manager.delete(s)
        return deleted

    def restore(self, step: int, abstract_params: Any, abstract_opt_state: Any) -> tuple[Any, Any, dict[str, Any]]:
        """Restores (params, opt_state, trainer_state) of `step` into the given shapes/shardings.

        `abstract_*` are pytrees of `jax.ShapeDtypeStruct` carrying shardings (or concrete arrays,
        whose shape, dtype and sharding are used).

        Raises:
          FileNotFoundError: when `step` has no committed checkpoint.
          Exception: whatever Orbax / tensorstore raise for a damaged checkpoint (see
            `is_damage_error`).
        """
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"no committed checkpoint for step {step} in {self.directory}; "
                                    f"available: {self.all_steps()}")

        def as_abstract(tree):
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                                tree)

        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(as_abstract(abstract_params)),
                opt_state=ocp.args.StandardRestore(as_abstract(abstract_opt_state)),
                trainer_state=ocp.args.JsonRestore(),
            ),
        )
        ts = out["trainer_state"]
        if not isinstance(ts, dict):
            raise ValueError(f"checkpoint {step}: trainer_state is a JSON {type(ts).__name__}, not an object")
        ts = dict(ts)
        saved = ts.pop(CHECKSUMS_KEY, None)
        for name in ("params", "opt_state"):
            verify_checksums(step, name, out[name], saved)
        return out["params"], out["opt_state"], ts

    def restore_extra(self, step: int, name: str, abstract: Any) -> Any:
        """The extra item `name` of `step`, restored into the shapes/shardings of `abstract`.

        Raises:
          FileNotFoundError: no committed checkpoint for `step`; other errors for a damaged one.
        """
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"no committed checkpoint for step {step} in {self.directory}")
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                              abstract)
        tree = self.manager.restore(step, args=ocp.args.Composite(**{name: ocp.args.StandardRestore(target)}))[name]
        saved = self._trainer_state_json(step).get(CHECKSUMS_KEY)
        verify_checksums(step, name, tree, saved)
        return tree

    def restore_trainer_state(self, step: int) -> dict[str, Any]:
        """Only the JSON trainer state of `step` (cheap: no arrays are read).

        Raises:
          FileNotFoundError: no committed checkpoint for `step`; other errors for a damaged one.
        """
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"no committed checkpoint for step {step} in {self.directory}")
        ts = self._trainer_state_json(step)
        ts.pop(CHECKSUMS_KEY, None)
        return ts

    def _trainer_state_json(self, step: int) -> dict[str, Any]:
        out = self.manager.restore(step, args=ocp.args.Composite(trainer_state=ocp.args.JsonRestore()))
        ts = out["trainer_state"]
        if not isinstance(ts, dict):
            raise ValueError(f"checkpoint {step}: trainer_state is a JSON {type(ts).__name__}, not an object")
        return dict(ts)

    def set_aside(self, step: int) -> str:
        """Moves the (damaged) checkpoint of `step` out of the managed directory, to
        `workdir/checkpoints_damaged/<step>` (or `<step>.N` if taken), so that later saves of that
        step do not collide with it and nothing is deleted. Returns the new path. Process 0
        moves; every process reloads the step list."""
        dest_dir = os.path.join(self.workdir, "checkpoints_damaged")
        dest = os.path.join(dest_dir, str(step))
        if jax.process_index() == 0:
            os.makedirs(dest_dir, exist_ok=True)
            k = 1
            while os.path.exists(dest):
                dest = os.path.join(dest_dir, f"{step}.{k}")
                k += 1
            os.rename(os.path.join(self.directory, str(step)), dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"jaxrl_ckpt_set_aside_{step}")
        self.manager.reload()
        return dest

    def close(self) -> None:
        """Waits for pending saves and closes the Orbax manager (idempotent)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self.manager.wait_until_finished()
        self.manager.close()


@contextlib.contextmanager
def collect_unraisable():
    """Collects the "Exception ignored in ..." reports (`sys.unraisablehook`) raised inside the
    block instead of printing them; yields the list of `sys.UnraisableHookArgs`-like records.

    A restore from a damaged checkpoint fails in one of Orbax's concurrent read coroutines; the
    others are then closed and garbage-collected with the same error, which Python prints as a
    long traceback per array (also while a later restore runs). The caller reports the damage in
    one line and drops them, or prints them with `replay_unraisable` when nothing was damaged.
    """
    caught = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda args: caught.append(
        types.SimpleNamespace(exc_type=args.exc_type, exc_value=args.exc_value, exc_traceback=args.exc_traceback,
                              err_msg=args.err_msg, object=args.object))
    try:
        yield caught
        gc.collect()  # finalize the abandoned coroutines now, inside the block
    finally:
        sys.unraisablehook = previous


def replay_unraisable(caught) -> None:
    """Prints records collected by `collect_unraisable` as Python's default hook would."""
    import traceback

    for args in caught:
        print(f"{args.err_msg or 'Exception ignored in'}: {args.object!r}", file=sys.stderr)
        traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=sys.stderr)


def silence_unraisable_about(paths: Iterable[str]) -> None:
    """From now on, drops "Exception ignored in ..." reports whose exception names one of `paths`
    (reads of a damaged checkpoint that Orbax abandoned and Python finalizes at some later point;
    the damage has been reported in one line). Other reports reach the previous hook."""
    paths = tuple(paths)
    previous = sys.unraisablehook

    def hook(args):
        if not any(p in str(args.exc_value) for p in paths):
            previous(args)

    sys.unraisablehook = hook


@contextlib.contextmanager
def quiet_read(path: str):
    """A single-process read of the files under `path` (a checkpoint or published version) whose
    failure the caller reports in one line: Orbax's abandoned concurrent reads are collected
    (`collect_unraisable`) and, when the block raises, silenced for good (`silence_unraisable_about`),
    else replayed as Python would print them."""
    try:
        with collect_unraisable() as library_noise:
            yield
    except BaseException:
        silence_unraisable_about([os.path.join(os.path.abspath(path), "")])
        raise
    replay_unraisable(library_noise)


def is_damage_error(e: BaseException) -> bool:
    """True for an exception that means "this checkpoint cannot be read" (a truncated or corrupt
    file), False for the ones that say nothing about the files: out of memory, interrupts."""
    if isinstance(e, (MemoryError, KeyboardInterrupt, SystemExit)):
        return False
    text = f"{type(e).__name__}: {e}"
    return "RESOURCE_EXHAUSTED" not in text and "Out of memory" not in text
