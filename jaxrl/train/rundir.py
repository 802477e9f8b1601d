"""The run directory's small contracts: the trainer state saved with every checkpoint, the
resolved config a resumed run must match, the run's wall time over all its launches
(`wall_time.json`), the errors that name a run file and its fix, and the fault injection the
kill tests use."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
from typing import Callable, Optional

from jaxrl import config as config_lib

# Keys that may differ between the rl_config.json of a run and the command that resumes it
# (sidecar URLs: a resubmitted cluster job gets other nodes for its engines; the optimizer offload
# only moves the state between device and host memory).
RESUMABLE_CHANGES = ("trainer.num_steps", "generator.sidecar_urls", "trainer.optimizer.offload")

# Fault injection for the kill tests: JAXRL_KILL_AT="<point>:<step>" makes the trainer SIGKILL
# itself at that point of that step (points: "generate" = after the step's rollouts were
# generated, "train" = after the step's update, before its weights are published, "save" = while
# the checkpoint of the step is being written; "load:<version>" = while the sidecars load a
# published version, see fleet.py).
KILL_ENV = "JAXRL_KILL_AT"


def maybe_kill(point: str, step: int) -> None:
    """Signals this process when `JAXRL_KILL_AT` is "<point>:<step>" (fault injection): SIGKILL,
    or the named signal with "<point>:<step>:<SIGNAME>" (e.g. "generate:3:SIGTERM", what a
    scheduler's time limit sends)."""
    spec = os.environ.get(KILL_ENV, "")
    if not spec:
        return
    parts = spec.split(":")
    if len(parts) >= 2 and parts[0] == point and parts[1] == str(step):
        import signal

        os.kill(os.getpid(), getattr(signal, parts[2]) if len(parts) > 2 else signal.SIGKILL)


# Folders and files a writer creates before it commits by a rename (weight_sync: sync/.tmp-<v>;
# Orbax: <step>.orbax-checkpoint-tmp-<n>; the HF export: best.tmp; fileio: .tmp_<name>.<pid>.<hex>).
PARTIAL_WRITE = re.compile(r"^(\.tmp-\d+|.*\.orbax-checkpoint-tmp.*|best\.tmp|\.tmp_.+)$")


def remove_partial_writes(workdir: str) -> list[str]:
    """Deletes every uncommitted write under `workdir` (`PARTIAL_WRITE`) and returns their paths.
    Committed checkpoints, versions and files are never touched (they have no such name). Call it
    on process 0 when a run stops on an error it cannot continue from (a full disk)."""
    removed = []
    for root, dirs, files in os.walk(workdir):
        for name in list(dirs) + files:
            if PARTIAL_WRITE.match(name):
                path = os.path.join(root, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                    dirs.remove(name)
                else:
                    try:
                        os.remove(path)
                    except OSError:
                        continue
                removed.append(path)
    return removed


class RunDirError(RuntimeError):
    """A file of the run directory cannot be used; the one-line message names it and the fix."""


class CheckpointError(RunDirError):
    """No usable checkpoint to resume from; the message names the files and the fix."""


LOCK_FILE = ".lock"


class WorkdirLock:
    """An exclusive lock on a run directory, so that two runs never write one workdir at once.

    `fcntl.flock` on `workdir/.lock`, taken by trainer process 0 (in a multi-host job the other
    processes share the workdir and take no lock) and held until `release` or the end of the
    process: the kernel drops it when the process dies, so a run killed with `kill -9` resumes
    at once. The holder writes its PID and host into the file so that a refused run can name it
    ("PID <pid> on host <host>"). The file is rewritten in place, never replaced: a rename would give a new inode,
    which a third run could lock while the holder still holds the old one. The descriptor is not
    inherited by child processes (sidecars, sandboxes), so the lock dies with the trainer. (On NFS
    the server keeps the lock of a node that crashed until that node's lease expires.)

    Within one process the lock is shared: acquiring a workdir the process already holds adds a
    holder (tests and notebooks build several trainers on one workdir in turn); the file lock is
    released when the last holder releases it.
    """

    _held: dict = {}  # realpath of the lock file -> [fd, holders]

    def __init__(self, path: str):
        self.path = path
        self._released = False

    @classmethod
    def acquire(cls, workdir: str) -> "WorkdirLock":
        """Locks `workdir` (an existing directory) for this process.

        Raises:
          RunDirError: another process holds the lock; the message names the workdir, the holder
            (pid and host, when it recorded them) and the fix.
        On a filesystem without `flock` support it prints one warning line and returns an unlocked
        handle (the run goes on, unprotected against a second run).
        """
        import fcntl
        import socket

        path = os.path.realpath(os.path.join(workdir, LOCK_FILE))
        held = cls._held.get(path)
        if held is not None:
            held[1] += 1
            return cls(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # non-inheritable (PEP 446)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            import errno

            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # e.g. ENOLCK, ENOSYS
                os.close(fd)
                print(f"jaxrl: warning: cannot lock {path} ({e.strerror}): this filesystem does not support "
                      "flock, so nothing stops a second run from writing the same workdir at the same time",
                      file=sys.stderr)
                lock = cls(path)
                lock._released = True
                return lock
            try:
                holder = os.read(fd, 256).decode("utf-8", "replace").strip()
            finally:
                os.close(fd)
            who = f"another run ({holder})" if holder else "another run"
            raise RunDirError(f"the workdir {workdir} is in use by {who}; two runs in one workdir would corrupt "
                              f"each other's checkpoints and logs (lock file {path}). Fix: wait until that run "
                              "ends (or stop it), or pass another --workdir") from None
        record = f"PID {os.getpid()} on host {socket.gethostname()}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        cls._held[path] = [fd, 1]
        return cls(path)

    def release(self) -> None:
        """Drops this holder; the last holder of the process unlocks the workdir (idempotent)."""
        if self._released:
            return
        self._released = True
        held = self._held.get(self.path)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del self._held[self.path]
            os.close(held[0])  # closing the only descriptor releases the flock


def read_json_object(path: str, what: str, fix: str) -> dict:
    """The JSON object stored in `path`.

    Raises:
      RunDirError: unreadable, not UTF-8, not JSON, or JSON that is not an object; one line
        naming `path`, what it should be (`what`) and `fix`.
    """
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise RunDirError(f"{path}: cannot read the {what} ({e.strerror}). Fix: {fix}") from None
    except UnicodeDecodeError:
        raise RunDirError(f"{path}: the {what} is not text (binary or non-UTF-8 bytes). Fix: {fix}") from None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: the {what} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}). "
                          f"Fix: {fix}") from None
    if not isinstance(obj, dict):
        raise RunDirError(f"{path}: the {what} must be a JSON object, found a JSON {type(obj).__name__}. Fix: {fix}")
    return obj



def read_finished_summary(path: str) -> Optional[dict]:
    """The summary.json of a finished run (read by `read_json_object`, like rl_config.json), or
    None after one stderr warning line naming `path` and what is wrong with it when it is
    unreadable, not UTF-8, not JSON or not an object (the trainer then finishes the run again,
    which rewrites it)."""
    try:
        return read_json_object(path, "run summary", "")
    except RunDirError as e:
        print(f"jaxrl: warning: {str(e).split('. Fix:')[0]}; finishing the run again to rewrite it", file=sys.stderr)
        return None

WALL_TIME_FILE = "wall_time.json"


class WallClock:
    """The wall time of a run over every launch of its command (a killed and resumed run counts
    the time of each process, including the steps a kill made it redo).

    `workdir/wall_time.json` holds `{"seconds": s, "launches": n}`: the seconds and the number of
    the launches before this one, as the last of them wrote it (`save`, an atomic write after each
    step and at the end, process 0 only). A missing file starts from 0 (a new run); an unreadable
    or invalid one does too, after one stderr warning line naming it.

    Args:
      workdir: the run directory.
      clock: the time source in seconds (`time.perf_counter`; tests pass a fake).
    """

    def __init__(self, workdir: str, clock: Callable[[], float] = time.perf_counter):
        self.path = os.path.join(workdir, WALL_TIME_FILE)
        self.clock = clock
        self.t0 = clock()
        self.previous_s, self.previous_launches = 0.0, 0
        if os.path.exists(self.path):
            try:
                d = read_json_object(self.path, "run's wall time", "")
                seconds, launches = float(d["seconds"]), int(d["launches"])
                if not (math.isfinite(seconds) and seconds >= 0 and launches >= 0):
                    raise ValueError("negative or non-finite")
                self.previous_s, self.previous_launches = seconds, launches
            except (RunDirError, KeyError, TypeError, ValueError) as e:
                reason = str(e).split(". Fix:")[0] if isinstance(e, RunDirError) else f"{self.path}: {one_line(e)}"
                print(f"jaxrl: warning: {reason}; the wall time counts this launch only", file=sys.stderr)

    def elapsed(self) -> float:
        """Seconds since this launch started its clock."""
        return self.clock() - self.t0

    def total(self) -> float:
        """Seconds of all launches of the run: the earlier ones plus this one so far."""
        return self.previous_s + self.elapsed()

    @property
    def launches(self) -> int:
        """Launches of the run, this one included."""
        return self.previous_launches + 1

    def save(self) -> None:
        """Writes the total so far and the launches to `wall_time.json` (atomic)."""
        config_lib.write_json_atomic(self.path, {"seconds": self.total(), "launches": self.launches})


def one_line(e: BaseException, limit: int = 160) -> str:
    """`Type: message` of an exception on one line (long library messages cut at `limit`)."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _short(value, limit: int = 40) -> str:
    text = repr(tuple(value) if isinstance(value, list) else value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def resume_mismatch_message(workdir: str, old: dict, new: dict, defaults: Optional[dict] = None) -> Optional[str]:
    """The one-line error for resuming the run in `workdir` (flat config `old`, its rl_config.json)
    with another flat config `new`, or None when they match (keys in `RESUMABLE_CHANGES` may differ).

    A key absent from `old` was added after that run's jaxrl version: it matches when `new` has its
    default (`defaults`, the flat base config: a key is added with the default that keeps the older
    behaviour), and None when `defaults` is not given. Lists every differing key as `key old -> new`:
    first the keys both configs have (what a command-line override or another recipe changes), then
    the keys only one has (another jaxrl version), each group in key order."""
    defaults = defaults or {}
    diff = [k for k in set(old) | set(new) if old.get(k, defaults.get(k)) != new.get(k)
            and k not in RESUMABLE_CHANGES]
    if not diff:
        return None
    both = sorted(k for k in diff if k in old and k in new)
    one = sorted(k for k in diff if k not in both)
    show = lambda d, k: _short(d[k]) if k in d else "(absent)"  # noqa: E731
    pairs = "; ".join(f"{k} {show(old, k)} -> {show(new, k)}" for k in both + one)
    n = len(diff)
    return (f"the workdir {workdir} holds a run with another config, so this command cannot resume it: {n} "
            f"key{'s' if n > 1 else ''} differ{'' if n > 1 else 's'} (the run's rl_config.json -> this command): "
            f"{pairs}. Fix: to resume, rerun with the run's values (only {', '.join(RESUMABLE_CHANGES)} may "
            "change); for a new run, pass another --workdir")


def check_resume_config(c, workdir: str, write: bool) -> None:
    """Compares `c` with the `rl_config.json` of a run already in `workdir` (keys in
    `RESUMABLE_CHANGES` may differ), then writes `c` there when `write` (process 0), unless the
    command trains nothing: a run whose newest checkpoint is at or past `c`'s `trainer.num_steps` is
    left as it is, its rl_config.json included (it keeps the num_steps the run trained to).

    Raises:
      ConfigError: the workdir holds a run with another config (`resume_mismatch_message`: every
        differing key with the run's value and this command's, and the fix).
      RunDirError: its rl_config.json cannot be read.
    """
    path = os.path.join(workdir, "rl_config.json")
    new = config_lib.to_json_dict(c)
    if os.path.exists(path):
        old = read_json_object(path, "resolved config of the run in this workdir",
                               "restore the file, delete it to resume under the config of this command, "
                               "or use a new --workdir")
        old.pop("_derived", None)  # notes derived from the config (below), not config keys
        defaults = _flatten(config_lib.to_json_dict(config_lib.base_config()))
        message = resume_mismatch_message(workdir, _flatten(old), _flatten(new), defaults)
        if message:
            raise config_lib.ConfigError(message)
        if (newest_checkpoint_step(workdir) or 0) >= c.trainer.num_steps:
            return
    if write:
        config_lib.write_json_atomic(path, {**new, "_derived": {"logprobs": config_lib.logprob_definitions(c)}})


def newest_checkpoint_step(workdir: str) -> Optional[int]:
    """The newest committed checkpoint step of the run in `workdir` (Orbax commits a step by renaming
    its temporary directory to the step number), or None; read from the directory names alone."""
    try:
        steps = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
    except OSError:
        return None
    return max(steps, default=None)


@dataclasses.dataclass
class TrainerState:
    """What a checkpoint stores besides params and optimizer state (JSON)."""

    step: int = 0
    policy_version: int = 0
    ema: dict = dataclasses.field(default_factory=dict)
    lr_scale: float = 1.0
    rollbacks: int = 0
    skipped_updates: int = 0
    events: list = dataclasses.field(default_factory=list)
    initial_eval: Optional[float] = None
    data_position: int = 0  # prompts consumed: trained on or dropped (sync: step * train_batch_size)
    # Asynchronous modes (docs/async.md): the first prompt never admitted, the prompts admitted
    # but not trained at the checkpoint (generated again after a resume), trajectories dropped as stale.
    async_next_prompt: int = 0
    async_pending: list = dataclasses.field(default_factory=list)
    dropped_stale_total: int = 0
    best_ckpt_step: int = -1  # the saved step with the highest reward EMA (what best/ exports)
    best_ckpt_ema: float = -math.inf
    kl_coef: Optional[float] = None  # use_kl_in_reward: the KL controller's beta (None = kl_loss_coef)

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "TrainerState":
        """The state saved in a checkpoint; fields added since it was written take their defaults.

        Raises:
          CheckpointError: unknown fields (written by another jaxrl version), naming `where`.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise CheckpointError(f"{where}: unknown trainer-state fields {unknown} (written by another jaxrl "
                                  "version). Fix: resume with the jaxrl version that wrote it, or use a new --workdir")
        return cls(**d)
