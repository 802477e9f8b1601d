"""Trial cgroups, the `cgroup` limits backend of the sandbox: finding a writable cgroup tree (the v1
pids / memory / cpu controllers of this process, or a delegated v2 subtree given as
`SandboxConfig.cgroup_parent`; `detect_cgroups`), and one cgroup per trial (`TrialCgroup`) with its
limits, OOM-kill and refused-fork counters, kill-everything and removal. Cgroups still alive at exit
are removed (`sandbox._cleanup_at_exit`).
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import signal
import threading
import time
from typing import Optional, Sequence

from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.sandbox_config import Limits

log = logging.getLogger(__name__)


def _cgroup_mounts() -> dict:
    """{"v2": mountpoint or None, "v1": {controller: mountpoint}} from /proc/self/mountinfo."""
    v1, v2 = {}, None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if not rfields:
                    continue
                if rfields[0] == "cgroup2" and v2 is None:
                    v2 = fields[4]
                elif rfields[0] == "cgroup":
                    for opt in rfields[2].split(","):
                        if opt in ("pids", "memory", "cpu"):
                            v1[opt] = fields[4]
    except OSError:
        pass
    return {"v1": v1, "v2": v2}


def _own_cgroups() -> dict:
    """{controller or "": path} from /proc/self/cgroup."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    out[c] = path
    except OSError:
        pass
    return out


class _Cgroups:
    """The cgroup tree the trial cgroups are created in (one parent per process, removed at exit)."""

    def __init__(self, version: str, bases: dict[str, str]):
        self.version = version
        self.bases = bases  # controller -> parent directory (v2: {"": dir})
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def create(self, limits: Limits, owner_uid: Optional[int]) -> "TrialCgroup":
        name = f"jaxrl-{os.getpid()}-{next(self._counter)}"
        dirs = {}
        try:
            for ctrl, base in self.bases.items():
                d = os.path.join(base, name)
                os.mkdir(d)
                dirs[ctrl] = d
            cg = TrialCgroup(self.version, dirs)
            cg.apply(limits)
            if owner_uid is not None:
                for f in cg.procs_files():
                    os.chown(f, owner_uid, owner_uid)
        except OSError as e:
            for d in dirs.values():
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            raise SandboxError(f"cannot create the trial cgroup under {list(self.bases.values())}: {e}") from None
        _LIVE_CGROUPS.add(cg)
        return cg


class TrialCgroup:
    """One trial's cgroup(s): limits, event counters, kill, removal."""

    def __init__(self, version: str, dirs: dict[str, str]):
        self.version = version
        self.dirs = dirs

    def _w(self, ctrl: str, name: str, value: str, required: bool = True) -> None:
        path = os.path.join(self.dirs[ctrl], name)
        try:
            with open(path, "w") as f:
                f.write(value)
        except OSError:
            if required:
                raise

    def apply(self, limits: Limits) -> None:
        mem = str(limits.memory_mb << 20)
        if self.version == "v1":
            self._w("pids", "pids.max", str(limits.processes))
            self._w("memory", "memory.limit_in_bytes", mem)
            self._w("memory", "memory.memsw.limit_in_bytes", mem, required=False)  # absent without swap accounting
            if "cpu" in self.dirs:
                self._w("cpu", "cpu.cfs_period_us", "100000", required=False)
                self._w("cpu", "cpu.cfs_quota_us", str(max(1000, int(limits.cpus * 100000))), required=False)
        else:
            self._w("", "pids.max", str(limits.processes))
            self._w("", "memory.max", mem)
            self._w("", "memory.swap.max", "0", required=False)
            self._w("", "cpu.max", f"{max(1000, int(limits.cpus * 100000))} 100000", required=False)

    def procs_files(self) -> list[str]:
        files = [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]
        if self.version == "v1":
            files += [os.path.join(d, "tasks") for d in self.dirs.values()]
        return files

    def join_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def _read_kv(self, path: str) -> dict:
        out = {}
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if v.strip().lstrip("-").isdigit():
                        out[k] = int(v)
        except OSError:
            pass
        return out

    def counters(self) -> dict:
        """{"memory": OOM kills, "pids": refused forks} so far."""
        if self.version == "v1":
            mem = self._read_kv(os.path.join(self.dirs["memory"], "memory.oom_control")).get("oom_kill", 0)
            pids = self._read_kv(os.path.join(self.dirs["pids"], "pids.events")).get("max", 0)
        else:
            mem = self._read_kv(os.path.join(self.dirs[""], "memory.events")).get("oom_kill", 0)
            pids = self._read_kv(os.path.join(self.dirs[""], "pids.events")).get("max", 0)
        return {"memory": mem, "pids": pids}

    def pids(self) -> list[int]:
        out = set()
        for d in self.dirs.values():
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return sorted(out)

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILLs every process in the cgroup until it is empty (or `timeout` seconds passed)."""
        if self.version == "v2" and os.path.exists(os.path.join(self.dirs[""], "cgroup.kill")):
            self._w("", "cgroup.kill", "1", required=False)
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if time.monotonic() > deadline:
                log.warning("cgroup %s still has processes %s after %.0f s", self.dirs, pids, timeout)
                return
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        log.warning("cannot remove cgroup %s: %s", d, e)
                        break
                    time.sleep(0.01)
        _LIVE_CGROUPS.discard(self)


_CGROUPS: dict = {}
_CGROUPS_LOCK = threading.Lock()


def _probe_cgroup_dir(d: str, files: Sequence[str]) -> Optional[str]:
    """None if a child cgroup with `files` can be created in `d`, else the reason."""
    probe = os.path.join(d, f"jaxrl-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except OSError as e:
        return f"cannot create a cgroup in {d} ({e.strerror})"
    try:
        missing = [f for f in files if not os.path.exists(os.path.join(probe, f))]
        return f"{d}: child cgroups lack {missing}" if missing else None
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def detect_cgroups(parent: Optional[str] = None) -> tuple[Optional[_Cgroups], str]:
    """The writable cgroup tree for trial cgroups, or (None, reason). Cached per `parent`."""
    with _CGROUPS_LOCK:
        if parent in _CGROUPS:
            return _CGROUPS[parent]
        mounts, own = _cgroup_mounts(), _own_cgroups()
        result: tuple[Optional[_Cgroups], str] = (None, "no cgroup filesystem mounted")
        v1 = mounts["v1"]
        if parent is None and "pids" in v1 and "memory" in v1:
            bases, reason = {}, None
            for ctrl in ("pids", "memory", "cpu"):
                if ctrl not in v1:
                    continue
                d = os.path.join(v1[ctrl], own.get(ctrl, "/").lstrip("/"))
                files = {"pids": ["pids.max"], "memory": ["memory.limit_in_bytes"], "cpu": ["cpu.cfs_quota_us"]}[ctrl]
                why = _probe_cgroup_dir(d, files)
                if why is None:
                    bases[ctrl] = d
                elif ctrl != "cpu":
                    reason = why
                    break
            result = (_Cgroups("v1", bases), "cgroup v1") if reason is None else (None, reason)
        elif mounts["v2"] is not None or parent is not None:
            d = parent or os.path.join(mounts["v2"], own.get("", "/").lstrip("/"))
            try:
                with open(os.path.join(d, "cgroup.subtree_control")) as f:
                    enabled = f.read().split()
            except OSError as e:
                enabled, why = [], f"cannot read {d}/cgroup.subtree_control ({e.strerror})"
            else:
                why = None
            if why is None and not {"pids", "memory"} <= set(enabled):
                why = (f"{d}: pids and memory controllers are not enabled for child cgroups (cgroup.subtree_control "
                       f"= {enabled}); give a delegated cgroup as sandbox.cgroup_parent")
            if why is None:
                why = _probe_cgroup_dir(d, ["pids.max", "memory.max"])
            result = (_Cgroups("v2", {"": d}), "cgroup v2") if why is None else (None, why)
        _CGROUPS[parent] = result
        return result


_LIVE_CGROUPS: set = set()
