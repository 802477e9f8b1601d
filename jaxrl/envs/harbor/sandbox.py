"""The per-trial sandbox: bubblewrap namespaces, resource limits, kill-everything cleanup.

Every command of a trial runs in a fresh `bwrap` instance over the trial's host directories:

=================  ===========================  ================================================
sandbox path        host directory               when
=================  ===========================  ================================================
/app                trial/app (rw)               always (the task's work directory)
/tmp                trial/tmp (rw)               always (private to the trial, counted as disk)
/home/agent         trial/home (rw)              always ($HOME)
/logs/agent         trial/logs/agent (rw)        always
/logs/artifacts     trial/logs/artifacts (rw)    always
/logs/verifier      trial/logs/verifier (rw)     verification only (fresh and empty)
/tests              trial/tests (ro)             verification only (a copy of the task's tests/)
/solution           task/solution (ro)           the oracle agent only
/usr, /bin, ...     host (ro)                    always (merged-/usr symlinks as on the host)
/etc                a curated copy (ro)          always (world-readable files only; synthetic
                                                 passwd, group, hosts, hostname)
/opt/jaxrl          the profile's bin/ + bashrc  always (python/pytest/pip wrappers, ro)
python prefixes     host (ro, same paths)        the `python` profile only
/proc, /dev         new procfs, minimal /dev      always (/dev read-only, /dev/shm a small tmpfs)
=================  ===========================  ================================================

The root is a read-only tmpfs; /proc is a new procfs mounted read-only (no sysctl writes). bwrap
flags: `--unshare-all --unshare-user` (user, mount, pid, ipc, uts, cgroup and network namespaces;
the new network namespace has only its own loopback, so the host's loopback services such as the
rollout sidecars are unreachable), `--disable-userns` (no nested user namespaces),
`--die-with-parent`, `--new-session` (no TIOCSTI into a host terminal), `--cap-drop ALL`,
`--uid/--gid 1000` inside, and a seccomp filter (`seccomp_program`: ptrace, keyrings, bpf,
perf_event_open, userfaultfd, io_uring, module/kexec/mount calls, unshare/setns,
open_by_handle_at, TIOCSTI/TIOCLINUX ioctls fail with EPERM). When the host process runs as root,
the sandbox uid maps to host uid 0 without any capability (bwrap can only map the caller's uid);
every bind except the trial's own directories is read-only and /etc is a curated subset without
secrets; `host_uid` runs the sandboxes as an unprivileged host uid instead. The network namespace is shared with the host only if
the task allows internet *and* `SandboxConfig.network == "host"` (which exposes the host's loopback;
off by default).

Limits (`Limits`, from task.toml clipped by `SandboxConfig` caps):

* processes and memory: a cgroup per trial (`pids.max`, memory limit, CPU quota) when the host's
  cgroup tree is writable (cgroup v1 as on the dev/CI machines, or a delegated v2 subtree given as
  `cgroup_parent`); otherwise rlimits set inside the sandbox: RLIMIT_NPROC, which since Linux 5.14 is
  counted per user namespace, i.e. per sandbox (but never applies to host uid 0: as root without
  writable cgroups set `host_uid` to run sandboxes as an unprivileged host user), and RLIMIT_AS.
* CPU time, file size, open files, core dumps: rlimits inside the sandbox (always).
* disk: RLIMIT_FSIZE per file, and the trial's monitor sums the blocks (and counts the files) under
  the trial's writable directories every `disk_check_interval_sec`, killing the trial's processes
  when `storage_mb` (or `max_files`) is exceeded. The overshoot is at most what can be written in
  one interval. One crossing of the limit counts as one `disk` event, however long the files stay.
  The verifier runs even when the agent left the trial over the limit: it is stopped only when it
  writes more than `storage_mb` (or `max_files`) on top of what was there at its start.
* wall clock: every command has a timeout; the trial enforces agent and verifier budgets.

Every process of a sandbox dies with its bwrap process (pid namespace); `Sandbox.kill_all` kills
every bwrap instance of the trial and, with cgroups, everything left in the trial's cgroup.

The host reads files the sandbox wrote only through `read_file_nofollow` (no symlink is followed,
only regular files, size-capped).
"""
from __future__ import annotations

import atexit
import dataclasses
import errno
import functools
import itertools
import logging
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.errors import SandboxError, SandboxUnavailableError
from jaxrl.envs.harbor.profiles import SANDBOX_PATH, EnvironmentSpec, get_profile
from jaxrl.envs.harbor.python_runtime import PythonRuntime, find_python

log = logging.getLogger(__name__)

BWRAP = "bwrap"
UNSAFE_HOST_BACKEND = "UNSAFE_host_no_isolation"
SANDBOX_HOME = "/home/agent"
_ETC_FILES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
              "os-release", "debian_version", "lsb-release", "issue", "timezone", "ssl/certs", "ssl/openssl.cnf",
              "ca-certificates", "ca-certificates.conf", "mime.types", "inputrc", "terminfo", "bash.bashrc",
              "profile", "profile.d", "magic", "magic.mime", "protocols", "services", "environment",
              "login.defs", "python3", "shells", "gai.conf", "host.conf")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """How trials are isolated and limited (caps apply on top of each task's task.toml values).

    Attributes:
      backend: "bwrap" (default) or `UNSAFE_HOST_BACKEND` ("UNSAFE_host_no_isolation": commands run
        directly on this host as the current user, the trial directories reached through symlinks at
        /app, /logs, /tests, /solution; one trial at a time; only for disposable machines where bwrap
        cannot run).
      limits_backend: "auto" (cgroups if writable, else rlimits), "cgroup" or "rlimit".
      cgroup_parent: a writable cgroup directory for the trial cgroups (default: the process's own
        cgroup; for cgroup v2 it must have `pids` and `memory` in `cgroup.subtree_control`).
      host_uid: run sandboxes as this host uid/gid (only when running as root). Required for process
        limits as root without writable cgroups. The trial directory's parents must be traversable
        by it and the `python` profile's Python readable by it.
      sandbox_uid: the uid (and gid) inside the sandbox.
      max_processes: processes (and threads) per trial.
      max_memory_mb / max_storage_mb / max_cpus: caps on task.toml's memory_mb / storage_mb / cpus.
      max_file_size_mb: RLIMIT_FSIZE (default: the trial's storage limit).
      cpu_time_sec: RLIMIT_CPU per process, seconds.
      open_files: RLIMIT_NOFILE.
      max_files: files and directories per trial (counted with the disk usage).
      shm_mb: size of /dev/shm.
      network: "none" (default; always, whatever the task says) or "host" (tasks with
        allow_internet = true share the host's network namespace, host loopback included: unsafe).
      python: the Python with pytest for the `python` profile (default: `profiles.find_python`).
      pip_mirror: a host directory of wheels and sdists (`pip download -d DIR PKG==VER ...`), bound
        read-only at `/opt/jaxrl-pip-mirror` in every trial; pip and uv then install from it alone
        (PIP_NO_INDEX, PIP_FIND_LINKS, UV_OFFLINE, UV_FIND_LINKS; a task's `[environment] env` can
        override them). The local mirror for verifiers that install their tools at verification time
        while the trial has no network (docs/terminal_tasks.md, "Network"). None: no mirror.
      bwrap_path: the bubblewrap executable.
      max_output_bytes: output kept per command (head and tail; the middle is dropped and counted).
      disk_check_interval_sec: period of the disk-usage check.
    """

    backend: str = "bwrap"
    limits_backend: str = "auto"
    cgroup_parent: Optional[str] = None
    host_uid: Optional[int] = None
    sandbox_uid: int = 1000
    max_processes: int = 256
    max_memory_mb: int = 4096
    max_storage_mb: int = 4096
    max_cpus: float = float(os.cpu_count() or 1)
    max_file_size_mb: Optional[int] = None
    cpu_time_sec: int = 900
    open_files: int = 1024
    max_files: int = 100_000
    shm_mb: int = 64
    network: str = "none"
    python: Optional[str] = None
    pip_mirror: Optional[str] = None
    bwrap_path: str = BWRAP
    max_output_bytes: int = 1 << 20
    disk_check_interval_sec: float = 0.5

    def validate(self) -> None:
        """Raises ValueError naming the field and the fix."""
        if self.backend not in ("bwrap", UNSAFE_HOST_BACKEND):
            raise ValueError(f"sandbox.backend={self.backend!r}: use 'bwrap' (or {UNSAFE_HOST_BACKEND!r}, "
                             "which runs agent commands on this host WITHOUT isolation)")
        if self.limits_backend not in ("auto", "cgroup", "rlimit"):
            raise ValueError(f"sandbox.limits_backend={self.limits_backend!r}: use 'auto', 'cgroup' or 'rlimit'")
        if self.network not in ("none", "host"):
            raise ValueError(f"sandbox.network={self.network!r}: use 'none' or 'host'")
        for k in ("max_processes", "max_memory_mb", "max_storage_mb", "cpu_time_sec", "open_files", "max_files",
                  "shm_mb", "max_output_bytes"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) <= 0:
                raise ValueError(f"sandbox.{k}={getattr(self, k)!r}: must be a positive integer")
        if self.max_processes < 8:
            raise ValueError(f"sandbox.max_processes={self.max_processes}: at least 8 (bash, bwrap and a command)")
        if not self.max_cpus > 0:
            raise ValueError(f"sandbox.max_cpus={self.max_cpus!r}: must be > 0")
        if self.host_uid is not None and (not isinstance(self.host_uid, int) or self.host_uid <= 0):
            raise ValueError(f"sandbox.host_uid={self.host_uid!r}: an unprivileged host uid (> 0) or None")
        if self.pip_mirror is not None and not os.path.isdir(self.pip_mirror):
            raise ValueError(f"pip mirror {self.pip_mirror!r} is not a directory: make it with `pip download -d DIR "
                             "PKG==VER ...` (docs/terminal_tasks.md, 'Network'), or leave it unset")

    def mirror_env(self) -> dict:
        """The variables that point pip and uv at `pip_mirror` inside a trial ({} without a mirror)."""
        if self.pip_mirror is None:
            return {}
        return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": PIP_MIRROR_MOUNT, "UV_OFFLINE": "1",
                "UV_FIND_LINKS": PIP_MIRROR_MOUNT}

    def mirror_binds(self) -> list:
        """The bwrap arguments that bind `pip_mirror` read-only at `PIP_MIRROR_MOUNT` ([] without one)."""
        return [] if self.pip_mirror is None else ["--ro-bind", os.path.abspath(self.pip_mirror), PIP_MIRROR_MOUNT]


PIP_MIRROR_MOUNT = "/opt/jaxrl-pip-mirror"
"""Where `SandboxConfig.pip_mirror` is bound inside a trial."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one trial (units in the names)."""

    processes: int
    memory_mb: int
    storage_mb: int
    file_size_mb: int
    cpu_time_sec: int
    cpus: float
    open_files: int
    max_files: int

    @classmethod
    def for_task(cls, task_config, config: SandboxConfig) -> "Limits":
        """task.toml's memory_mb / storage_mb / cpus clipped by the config's caps."""
        storage = min(int(task_config.storage_mb), config.max_storage_mb)
        fsize = min(config.max_file_size_mb or storage, storage)
        return cls(processes=config.max_processes, memory_mb=min(int(task_config.memory_mb), config.max_memory_mb),
                   storage_mb=storage, file_size_mb=max(1, fsize), cpu_time_sec=config.cpu_time_sec,
                   cpus=min(float(task_config.cpus), config.max_cpus), open_files=config.open_files,
                   max_files=config.max_files)


# ---------------------------------------------------------------------------------------------
# Host detection


@dataclasses.dataclass(frozen=True)
class HostInfo:
    euid: int
    kernel: tuple[int, int]
    bwrap: Optional[str]
    cgroup: Optional[str]  # "v1", "v2" or None
    cgroup_reason: str


def _kernel_version() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


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


@functools.lru_cache(maxsize=None)
def _bwrap_probe(bwrap: str, as_uid: Optional[int]) -> Optional[str]:
    """None if bwrap can create a full sandbox here, else the reason."""
    exe = shutil.which(bwrap)
    if exe is None:
        return (f"bubblewrap is not installed (`{bwrap}` is not on PATH): install it with "
                "`apt-get install -y bubblewrap` (sudo when not root)")
    argv = [exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", *_root_links(), "--proc", "/proc", "--dev", "/dev",
            "--", "/bin/true"]
    kw = {"user": as_uid, "group": as_uid, "extra_groups": []} if as_uid is not None else {}
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap ({exe}) cannot run: {e}"
    if p.returncode != 0:
        return (f"bubblewrap cannot create a sandbox on this host: {p.stderr.strip() or p.returncode}. User "
                "namespaces are probably disabled (sysctl user.max_user_namespaces=0 or "
                "kernel.unprivileged_userns_clone=0, or a container seccomp profile that blocks them)")
    return None


def _root_links() -> list[str]:
    out = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = "/" + name
        if os.path.islink(p):
            out += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            out += ["--ro-bind", p, p]
    return out


@functools.lru_cache(maxsize=None)
def host_info(cgroup_parent: Optional[str] = None) -> HostInfo:
    cg, why = detect_cgroups(cgroup_parent)
    return HostInfo(euid=os.geteuid(), kernel=_kernel_version(), bwrap=shutil.which(BWRAP),
                    cgroup=cg.version if cg else None, cgroup_reason=why)


def check_sandbox(config: SandboxConfig) -> str:
    """Checks that trials can be sandboxed with `config` here; returns the limits backend used
    ("cgroup" or "rlimit", or "none" for the unsafe host backend).

    Raises:
      SandboxUnavailableError: with the reason and the fix.
    """
    config.validate()
    if config.backend == UNSAFE_HOST_BACKEND:
        return "none"
    if config.host_uid is not None and os.geteuid() != 0:
        raise SandboxUnavailableError("sandbox.host_uid needs root (the sandboxes already run as the current, "
                                      "unprivileged user); unset it")
    why = _bwrap_probe(config.bwrap_path, config.host_uid)
    if why:
        raise SandboxUnavailableError(why)
    cg, cg_why = detect_cgroups(config.cgroup_parent)
    if config.limits_backend == "cgroup" or (config.limits_backend == "auto" and cg is not None):
        if cg is None:
            raise SandboxUnavailableError(f"sandbox.limits_backend='cgroup' but no writable cgroup tree: {cg_why}")
        return "cgroup"
    # rlimit backend
    if _kernel_version() < (5, 14):
        raise SandboxUnavailableError(
            f"no writable cgroups ({cg_why}) and kernel {platform.release()} < 5.14 counts RLIMIT_NPROC per host "
            "user, not per sandbox: process limits cannot be enforced; give a writable cgroup (sandbox.cgroup_parent)")
    if os.geteuid() == 0 and config.host_uid is None:
        raise SandboxUnavailableError(
            f"running as root without writable cgroups ({cg_why}): RLIMIT_NPROC does not apply to host uid 0, so a "
            "fork bomb could not be stopped; set sandbox.host_uid to an unprivileged uid (e.g. 65534) or make a "
            "cgroup writable (sandbox.cgroup_parent)")
    return "rlimit"


# ---------------------------------------------------------------------------------------------
# seccomp: a small deny list on top of the namespaces (bwrap --seccomp)

# name: (x86_64, aarch64) syscall numbers. None of these is needed by shell, Python or pytest work;
# several are the usual first steps of a kernel or container escape.
SECCOMP_DENY = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "unshare": (272, 97),
    "setns": (308, 268), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
}
SECCOMP_DENY_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
_ARCH = {"x86_64": (0xC000003E, 0, 16), "aarch64": (0xC00000B7, 1, 29)}  # audit arch, column, ioctl nr


def seccomp_program(machine: Optional[str] = None) -> Optional[bytes]:
    """The classic-BPF seccomp filter bwrap installs (`--seccomp FD`): the syscalls in `SECCOMP_DENY`
    and the ioctls `TIOCSTI` / `TIOCLINUX` (terminal input injection) fail with EPERM; syscalls of
    another architecture (and x32 on x86_64) fail with ENOSYS; everything else is allowed.
    None on architectures other than x86_64 and aarch64."""
    import struct

    machine = machine or platform.machine()
    if machine not in _ARCH:
        return None
    audit_arch, col, ioctl_nr = _ARCH[machine]
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    nrs = sorted({v[col] for v in SECCOMP_DENY.values()})
    prog: list = [(LD, 0, 0, 4), (JEQ, 1, 0, audit_arch), (RET, 0, 0, ENOSYS), (LD, 0, 0, 0)]
    checks = []  # (opcode, k) instructions that jump to DENY when true
    if machine == "x86_64":
        checks.append((JGE, 0x40000000))
    checks += [(JEQ, nr) for nr in nrs]
    n_checks = len(checks)
    # layout after the checks: [jeq ioctl -> (next) else ALLOW], ld arg1, jeq TIOCSTI, jeq TIOCLINUX, ALLOW, DENY
    tail = 1 + 1 + len(SECCOMP_DENY_IOCTLS) + 1  # ioctl jeq, ld, ioctl checks, ALLOW
    for i, (op, k) in enumerate(checks):
        prog.append((op, n_checks - i - 1 + tail, 0, k))
    prog.append((JEQ, 0, 1 + len(SECCOMP_DENY_IOCTLS), ioctl_nr))
    prog.append((LD, 0, 0, 24))  # seccomp_data.args[1], low 32 bits (little endian)
    for i, k in enumerate(SECCOMP_DENY_IOCTLS.values()):
        prog.append((JEQ, len(SECCOMP_DENY_IOCTLS) - i, 0, k))
    prog.append((RET, 0, 0, ALLOW))
    prog.append((RET, 0, 0, EPERM))
    assert all(jt < 256 and jf < 256 for _, jt, jf, _ in prog)
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


_SECCOMP_FILE: list = []


def _seccomp_file() -> Optional[str]:
    with _PROFILE_LOCK:
        if not _SECCOMP_FILE:
            prog = seccomp_program()
            if prog is None:
                log.warning("no seccomp filter for %s: sandboxes rely on namespaces only", platform.machine())
                _SECCOMP_FILE.append(None)
            else:
                fd, path = tempfile.mkstemp(prefix="jaxrl-seccomp-", suffix=".bpf")
                with os.fdopen(fd, "wb") as f:
                    f.write(prog)
                os.chmod(path, 0o644)
                _SECCOMP_FILE.append(path)
        return _SECCOMP_FILE[0]


# ---------------------------------------------------------------------------------------------
# Profile directory (/opt/jaxrl): wrappers on PATH, rc file, synthetic /etc files


_PROFILE_DIRS: dict = {}
_PROFILE_LOCK = threading.Lock()
PROMPT_MARK = "\x1b]7770;jaxrl-prompt\x07"  # invisible OSC sequence: the shell is at its prompt


def _profile_dir(python: Optional[PythonRuntime], sandbox_uid: int) -> str:
    key = (python.executable if python else None, sandbox_uid)
    with _PROFILE_LOCK:
        if key in _PROFILE_DIRS:
            return _PROFILE_DIRS[key]
        d = tempfile.mkdtemp(prefix="jaxrl-sandbox-profile-")
        os.chmod(d, 0o755)
        os.makedirs(os.path.join(d, "bin"), mode=0o755)
        os.makedirs(os.path.join(d, "etc"), mode=0o755)
        if python:
            exe = shlex.quote(python.executable)
            for name, body in (("python3", f"exec {exe} \"$@\""), ("python", f"exec {exe} \"$@\""),
                               ("pytest", f"exec {exe} -m pytest \"$@\""), ("pip", f"exec {exe} -m pip \"$@\""),
                               ("pip3", f"exec {exe} -m pip \"$@\"")):
                p = os.path.join(d, "bin", name)
                with open(p, "w") as f:
                    f.write(f"#!/bin/sh\n{body}\n")
                os.chmod(p, 0o755)
        u = sandbox_uid
        files = {
            "etc/passwd": f"root:x:0:0:root:/root:/bin/bash\nagent:x:{u}:{u}:agent:{SANDBOX_HOME}:/bin/bash\n"
                          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "etc/group": f"root:x:0:\nagent:x:{u}:\nnogroup:x:65534:\n",
            "etc/hostname": "sandbox\n",
            "etc/hosts": "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n",
            "bashrc": ("PS1='\\[" + PROMPT_MARK.replace("\x1b", "\\e").replace("\x07", "\\a") + "\\]agent@sandbox:\\w$ '\n"
                       "PS2='> '\nunset PROMPT_COMMAND HISTFILE\nexport HISTFILE=\n"),
        }
        _copy_etc(os.path.join(d, "etc"))
        for rel, text in files.items():
            p = os.path.join(d, rel)
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, 0o644)
        _PROFILE_DIRS[key] = d
        return d


def _copy_etc(dst: str) -> None:
    """Copies the curated `_ETC_FILES` of the host's /etc into `dst` (bound as the sandbox's /etc in one
    mount): symlinks as symlinks, and only files every user may read (no secrets)."""
    def readable(st):
        return st.st_mode & stat.S_IROTH

    for name in _ETC_FILES:
        src = os.path.join("/etc", name)
        if not os.path.lexists(src):
            continue
        target = os.path.join(dst, name)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        try:
            if os.path.islink(src):
                os.symlink(os.readlink(src), target)
            elif os.path.isdir(src):
                for dirpath, dirnames, filenames in os.walk(src):
                    rel = os.path.relpath(dirpath, src)
                    out = os.path.normpath(os.path.join(target, rel))
                    st = os.stat(dirpath)
                    if not (readable(st) and st.st_mode & stat.S_IXOTH):
                        dirnames[:] = []
                        continue
                    os.makedirs(out, mode=0o755, exist_ok=True)
                    for n in dirnames + filenames:
                        sp, tp = os.path.join(dirpath, n), os.path.join(out, n)
                        if os.path.islink(sp):
                            os.symlink(os.readlink(sp), tp)
                            if n in dirnames:
                                dirnames.remove(n)
                        elif os.path.isfile(sp) and readable(os.stat(sp)):
                            shutil.copyfile(sp, tp)
                            os.chmod(tp, 0o644)
            elif os.path.isfile(src) and readable(os.stat(src)):
                shutil.copyfile(src, target)
                os.chmod(target, 0o644)
        except OSError as e:
            log.debug("not copying %s into the sandbox /etc: %s", src, e)


_LIVE_CGROUPS: set = set()


@atexit.register
def _cleanup_at_exit():
    for cg in list(_LIVE_CGROUPS):
        cg.remove()
    for d in _PROFILE_DIRS.values():
        shutil.rmtree(d, ignore_errors=True)
    for f in _SECCOMP_FILE:
        if f:
            try:
                os.remove(f)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# Safe host-side reads and disk usage


def read_file_nofollow(dirpath: str | os.PathLike, name: str, max_bytes: int,
                       tail: bool = False) -> tuple[Optional[bytes], str]:
    """Reads `dirpath/name` without following symlinks (neither `dirpath` nor `name`), only if it is a
    regular file; returns (data or None, reason). At most `max_bytes` are read: the first ones, or
    the last ones with `tail`."""
    try:
        dfd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        return None, f"{dirpath}: {e.strerror}"
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dfd)
        except FileNotFoundError:
            return None, "missing"
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None, "is a symlink"
            return None, e.strerror
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, "not a regular file"
            if tail and st.st_size > max_bytes:
                os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
            chunks, n = [], 0
            while n < max_bytes:
                b = os.read(fd, min(1 << 16, max_bytes - n))
                if not b:
                    break
                chunks.append(b)
                n += len(b)
            return b"".join(chunks), ""
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def disk_usage(paths: Sequence[str | os.PathLike], stop_at_files: int = 10 ** 9) -> tuple[int, int]:
    """(bytes allocated, number of entries) under `paths`, symlinks not followed (st_blocks * 512)."""
    total, count = 0, 0
    stack = [os.fspath(p) for p in paths]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                count += 1
                if count > stop_at_files:
                    return total, count
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
    return total, count


def remove_tree(path: str | os.PathLike) -> None:
    """Removes a directory the sandbox wrote into: symlinks are not followed (shutil.rmtree's fd-based
    walk); directories the sandbox made inaccessible (chmod 000) are made accessible (by their owner,
    never through a link) and the removal retried, one more level per pass.

    Raises:
      OSError: the tree could not be removed after those retries.
    """
    path = os.fspath(path)

    def onerror(func, p, exc_info):
        for q in (os.path.dirname(p), p):
            try:
                st = os.lstat(q)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(q, 0o700)
            except OSError:
                pass

    for _ in range(64):
        if not os.path.lexists(path):
            return
        shutil.rmtree(path, onerror=onerror)
    shutil.rmtree(path)  # raises with the reason


class CappedBuffer:
    """Keeps the first and last `limit // 2` bytes written to it; counts what was dropped between."""

    def __init__(self, limit: int):
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self.lock = threading.Lock()

    def write(self, b: bytes) -> None:
        with self.lock:
            room = self.half - len(self.head)
            if room > 0:
                self.head += b[:room]
                b = b[room:]
            if b:
                self.tail += b
                if len(self.tail) > self.half:
                    cut = len(self.tail) - self.half
                    self.dropped += cut
                    del self.tail[:cut]

    def getvalue(self) -> bytes:
        with self.lock:
            if self.dropped:
                return bytes(self.head) + f"\n[... {self.dropped} bytes omitted ...]\n".encode() + bytes(self.tail)
            return bytes(self.head + self.tail)


# ---------------------------------------------------------------------------------------------
# The sandbox


@dataclasses.dataclass
class RunResult:
    """The outcome of one sandboxed command.

    Attributes:
      output: stdout and stderr interleaved, decoded as UTF-8 (invalid bytes replaced), capped at
        `max_output_bytes` keeping head and tail.
      exit_code: the command's exit status; 128 + N when killed by signal N; None if it timed out
        or was killed by the trial.
      timed_out: the command's wall-clock timeout expired.
      duration_sec: wall-clock seconds.
      limit: the limit that stopped it, if one is known: "timeout", "memory", "pids", "file_size",
        "cpu_time", "disk", or the reason given to `Sandbox.kill_all` while it ran ("agent_timeout",
        "killed", ...); None otherwise.
    """

    output: str
    exit_code: Optional[int]
    timed_out: bool
    duration_sec: float
    limit: Optional[str] = None


class Sandbox:
    """The sandbox of one trial: its host directories, limits, cgroup and live processes.

    Args:
      root: the trial directory (created; must not exist or be empty).
      environment: the task's resolved environment (profile, env vars, files to copy into /app).
      limits: the trial's limits.
      config: the sandbox configuration.
      allow_internet: the task's `allow_internet`.
    """

    def __init__(self, root: str | os.PathLike, environment: EnvironmentSpec, limits: Limits,
                 config: SandboxConfig = SandboxConfig(), allow_internet: bool = False):
        self.root = Path(root).absolute()
        self.environment = environment
        self.limits = limits
        self.config = config
        self.allow_internet = allow_internet
        self.limits_backend = check_sandbox(config)
        # "image": the task's own built image (images.ImageSandbox), no host profile
        self.profile = get_profile(environment.profile) if environment.profile != "image" else None
        self.python = find_python(config.python) if self.profile is not None and self.profile.python else None
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.cgroup: Optional[TrialCgroup] = None
        self._kills: list[str] = []  # reasons given to kill_all, in order
        self.dirs = {k: self.root / k for k in ("app", "tmp", "home", "logs/agent", "logs/artifacts", "logs/verifier")}
        self._unsafe = config.backend == UNSAFE_HOST_BACKEND

    # -- setup ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Creates the trial directories, copies the environment's files into /app, creates the cgroup.

        Raises:
          SandboxError: the trial directory is not empty / not reachable by `host_uid`, or the cgroup fails.
        """
        if self.root.exists() and any(self.root.iterdir()):
            raise SandboxError(f"trial directory {self.root} is not empty")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711 if self.config.host_uid is not None else 0o700)
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "logs", 0o755)
        app = self.dirs["app"]
        for rel in self.environment.mkdirs:
            (app / os.path.relpath(rel, "/app")).mkdir(parents=True, exist_ok=True)
        for src, dest, mode in self.environment.copies:
            target = app / os.path.relpath(dest, "/app")
            if os.path.isdir(src):
                shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target, follow_symlinks=False)
            if mode is not None:
                os.chmod(target, mode)
        uid = self.config.host_uid
        if uid is not None:
            self._check_traversable(uid)
            for d in list(self.dirs.values()) + [self.root / "logs"]:
                for dirpath, dirnames, filenames in os.walk(d):
                    os.chown(dirpath, uid, uid)
                    for n in filenames + dirnames:
                        os.lchown(os.path.join(dirpath, n), uid, uid)
        if self.limits_backend == "cgroup":
            cg, _ = detect_cgroups(self.config.cgroup_parent)
            self.cgroup = cg.create(self.limits, uid)

    def _check_traversable(self, uid: int) -> None:
        paths = [self.root] + list(self.root.parents)
        if self.python:
            for b in self.python.bind_paths:
                paths += [Path(b)] + list(Path(b).parents)
        for p in paths:
            st = os.stat(p)
            if not (st.st_mode & stat.S_IXOTH or (st.st_uid == uid and st.st_mode & stat.S_IXUSR)):
                raise SandboxError(f"{p} (mode {stat.filemode(st.st_mode)}) is not traversable by sandbox.host_uid="
                                   f"{uid}: put trials and the sandbox Python under directories others can enter "
                                   "(chmod o+x), or use cgroups instead of host_uid")

    # -- argv ------------------------------------------------------------------------------------
    def env(self, extra: Optional[dict] = None, terminal: bool = False) -> dict:
        env = {"PATH": SANDBOX_PATH, "HOME": SANDBOX_HOME, "USER": "agent", "LOGNAME": "agent",
               "SHELL": "/bin/bash", "LANG": "C.UTF-8", "HOSTNAME": "sandbox"}
        if terminal:
            env["TERM"] = "dumb"
        if self._unsafe:
            env["PATH"] = SANDBOX_PATH.replace("/opt/jaxrl", _profile_dir(self.python, self.config.sandbox_uid))
        mirror = self.config.mirror_env()
        if self._unsafe and mirror:  # no mount namespace: the host's own path
            mirror = {k: os.path.abspath(self.config.pip_mirror) if v == PIP_MIRROR_MOUNT else v
                      for k, v in mirror.items()}
        env.update(mirror)
        env.update(dict(self.environment.env))
        env.update(extra or {})
        return env

    def _limit_prologue(self) -> str:
        lim = self.limits
        cmds = ["ulimit -c 0", f"ulimit -n {lim.open_files}", f"ulimit -f {lim.file_size_mb * 1024}",
                f"ulimit -S -t {lim.cpu_time_sec}", f"ulimit -H -t {lim.cpu_time_sec + 5}"]  # SIGXCPU, then SIGKILL
        if self.limits_backend == "rlimit":
            cmds += [f"ulimit -u {lim.processes}", f"ulimit -v {lim.memory_mb * 1024}"]
        return " && ".join(cmds) + " || { echo 'jaxrl sandbox: cannot set resource limits' >&2; exit 125; }\n"

    def bwrap_argv(self, command: Sequence[str], *, phase_binds: Sequence[tuple[str, str, bool]] = (),
                   env: Optional[dict] = None, cwd: Optional[str] = None, seccomp_fd: Optional[int] = None) -> list[str]:
        """The full argv (bwrap and its arguments) that runs `command` in this trial's sandbox.

        Args:
          command: argv inside the sandbox (run after the limit prologue).
          phase_binds: extra `(host path, sandbox path, writable)` binds (/tests, /solution, /logs/verifier).
          env: the complete environment inside the sandbox.
          cwd: working directory inside (default: the environment's workdir).
          seccomp_fd: an open file descriptor of `seccomp_program()` to install.
        """
        c = self.config
        u = str(c.sandbox_uid)
        argv = [shutil.which(c.bwrap_path) or c.bwrap_path, "--unshare-all", "--unshare-user", "--disable-userns",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--uid", u, "--gid", u,
                "--hostname", "sandbox"]
        if self.allow_internet and c.network == "host":
            argv.append("--share-net")
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        argv += ["--ro-bind", "/usr", "/usr", *_root_links()]
        prof = _profile_dir(self.python, c.sandbox_uid)
        argv += ["--ro-bind", os.path.join(prof, "etc"), "/etc", "--ro-bind", prof, "/opt/jaxrl"]
        argv += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev", "--size", str(c.shm_mb << 20), "--perms", "1777",
                 "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        argv += ["--bind", str(self.dirs["app"]), "/app", "--bind", str(self.dirs["tmp"]), "/tmp",
                 "--bind", str(self.dirs["home"]), SANDBOX_HOME,
                 "--bind", str(self.dirs["logs/agent"]), "/logs/agent",
                 "--bind", str(self.dirs["logs/artifacts"]), "/logs/artifacts",
                 "--dir", "/var", "--symlink", "../tmp", "/var/tmp"]
        # The interpreter's paths go after the trial's own /tmp, /app, home and /logs: a Python installed
        # under /tmp on the host (a venv in a clone under /tmp) stays visible, read-only, instead of being
        # hidden by the private /tmp mounted over it (every pytest verifier then failed with reward 0).
        if self.python:
            for b in self.python.bind_paths:
                for mount in ("/tmp", "/app", "/logs", SANDBOX_HOME, "/var"):
                    if mount == b or mount.startswith(b.rstrip("/") + "/"):
                        raise SandboxError(
                            f"the sandbox's Python needs {b} bound read-only, which would cover the trial's {mount}; "
                            "install it elsewhere or point JAXRL_SANDBOX_PYTHON (or sandbox.python) at another Python")
                argv += ["--ro-bind", b, b]
        argv += c.mirror_binds()
        for src, dest, writable in phase_binds:
            argv += ["--bind" if writable else "--ro-bind", str(src), dest]
        argv += ["--remount-ro", "/", "--chdir", cwd or self.environment.workdir, "--clearenv"]
        for k, v in (env if env is not None else self.env()).items():
            argv += ["--setenv", k, v]
        argv += ["--", "/bin/bash", "-c", self._limit_prologue() + 'exec "$@"', "jaxrl-sandbox", *command]
        return argv

    def _launch_argv(self, argv: list[str]) -> list[str]:
        """Prefixes a wrapper that puts the process into the trial cgroup before exec'ing bwrap."""
        if self.cgroup is None:
            return argv
        files = self.cgroup.join_files()
        script = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(files)))
        script += f' || {{ echo "jaxrl sandbox: cannot join the trial cgroup" >&2; exit 124; }}; shift {len(files)}; exec "$@"'
        return ["/bin/sh", "-c", script, "jaxrl-cgroup", *files, *argv]

    # -- processes -----------------------------------------------------------------------------
    def popen(self, command: Sequence[str], *, phase_binds=(), env: Optional[dict] = None, cwd: Optional[str] = None,
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) -> subprocess.Popen:
        """Starts `command` in a new sandbox instance of this trial (registered for `kill_all`).

        Raises:
          SandboxError: the trial was closed, or the process cannot be started.
        """
        if self._unsafe:
            return self._popen_unsafe(command, phase_binds=phase_binds, env=env, cwd=cwd, stdin=stdin,
                                      stdout=stdout, stderr=stderr)
        sfile = _seccomp_file()
        sfd = os.open(sfile, os.O_RDONLY) if sfile else None
        try:
            argv = self._launch_argv(self.bwrap_argv(command, phase_binds=phase_binds, env=env, cwd=cwd,
                                                     seccomp_fd=sfd))
            kw = {}
            if self.config.host_uid is not None:
                kw = {"user": self.config.host_uid, "group": self.config.host_uid, "extra_groups": []}
            with self._lock:
                if self._closed:
                    raise SandboxError(f"trial sandbox {self.root} is closed")
                try:
                    p = _spawn(lambda: subprocess.Popen(
                        _with_default_signals(argv), stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True,
                        close_fds=True, pass_fds=() if sfd is None else (sfd,), env={"PATH": "/usr/bin:/bin"},
                        **_signal_kwargs(), **kw))
                except OSError as e:
                    raise SandboxError(f"cannot start the sandbox: {e}") from None
                self._procs.add(p)
        finally:
            if sfd is not None:
                os.close(sfd)
        return p

    def _forget(self, p: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(p)

    def kill(self, p: subprocess.Popen) -> None:
        """Kills one sandbox instance (its bwrap; the pid namespace takes every process inside with it)."""
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_all(self, reason: Optional[str] = None) -> None:
        """Kills every live sandbox instance of the trial and everything in its cgroup."""
        with self._lock:
            self._kills.append(reason or "killed")
            procs = list(self._procs)
        for p in procs:
            self.kill(p)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("sandbox process %d did not exit after SIGKILL", p.pid)
        if self.cgroup is not None:
            self.cgroup.kill_all()
        if self._unsafe:
            _unsafe_kill_session(procs)

    def counters(self) -> dict:
        return self.cgroup.counters() if self.cgroup else {"memory": 0, "pids": 0}

    def disk_usage(self) -> tuple[int, int]:
        """(bytes, entries) under the trial's writable directories."""
        return disk_usage([self.dirs[k] for k in ("app", "tmp", "home", "logs/agent", "logs/artifacts",
                                                  "logs/verifier")], stop_at_files=self.limits.max_files + 1)

    def over_disk(self, base: tuple[int, int] = (0, 0)) -> Optional[str]:
        """Why the trial is over its disk limit (None when it is not).

        Args:
          base: (bytes, entries) already present that do not count against the limit (the
            verifier's allowance is `storage_mb` / `max_files` on top of what the agent left).
        """
        used, n = self.disk_usage()
        if used - base[0] > self.limits.storage_mb << 20:
            extra = f" on top of the {base[0] >> 20} MB at its start" if base[0] else ""
            return f"disk usage {(used - base[0]) >> 20} MB{extra} exceeds storage_mb={self.limits.storage_mb}"
        if n - base[1] > self.limits.max_files:
            return f"more than {self.limits.max_files} files" + (f" on top of {base[1]}" if base[1] else "")
        return None

    def run(self, command: Sequence[str], timeout: Optional[float], *, phase_binds=(), env: Optional[dict] = None,
            cwd: Optional[str] = None, watch_disk: bool = True, linger: bool = False) -> RunResult:
        """Runs `command` in a new sandbox instance and waits for it (output captured, capped).

        `timeout` None means no command timeout (the trial's own limits still apply). A command over
        the disk limit is killed (`limit="disk"`). With `linger`, the instance outlives the command:
        the processes it left in the background keep running (as after a `docker exec`) until
        `kill_all` / `close`; the result comes when the command itself exits.
        """
        t0 = time.monotonic()
        before = self.counters()
        kills_before = len(self._kills)
        exit_file = None
        if linger and self._unsafe:
            linger = False  # no instance to keep without bwrap: the command's background processes die with it
        if linger:
            name = f".jaxrl-exit-{uuid.uuid4().hex}"
            exit_file = self.dirs["tmp"] / name
            command = ["/bin/bash", "-c", '"$@"; c=$?; echo "$c" > /tmp/' + name + '.part && mv /tmp/' + name
                       + '.part /tmp/' + name + '; exec sleep 2147483647 </dev/null >/dev/null 2>&1',
                       "jaxrl-linger", *command]
        p = self.popen(command, phase_binds=phase_binds, env=env, cwd=cwd)
        buf = CappedBuffer(self.config.max_output_bytes)

        def pump():
            while True:
                b = p.stdout.read1(1 << 16)
                if not b:
                    break
                buf.write(b)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        done = threading.Event()

        def waiter():  # a blocking waitpid: Popen.wait(timeout) would poll with growing sleeps
            p.wait()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        timed_out, limit = False, None
        deadline = None if timeout is None else t0 + timeout
        interval = self.config.disk_check_interval_sec if watch_disk else 3600.0
        if linger:
            interval = min(interval, 0.05)
        lingered_code: Optional[int] = None
        try:
            while True:
                wait = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
                if done.wait(wait):
                    break
                if exit_file is not None and exit_file.is_file():
                    try:
                        lingered_code = int(exit_file.read_text().strip())
                        exit_file.unlink()
                    except (OSError, ValueError):
                        lingered_code = None
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out, limit = True, "timeout"
                    self.kill(p)
                    done.wait()
                    break
                if watch_disk:
                    why = self.over_disk()
                    if why:
                        log.info("trial %s: %s; killing it", self.root.name, why)
                        self.kill_all("disk")
                        done.wait()
                        break
        finally:
            if lingered_code is None and p.poll() is None:
                self.kill(p)
                p.wait()
            if lingered_code is None:
                reader.join(timeout=5)
                self._forget(p)  # a lingering instance stays registered: kill_all / close end it
            else:
                time.sleep(0.05)  # the command's last output
        if watch_disk and limit is None and self.over_disk():
            limit = "disk"
        if limit is None and len(self._kills) > kills_before:
            limit = self._kills[-1]
        code = p.returncode if lingered_code is None else lingered_code
        after = self.counters()
        if limit is None:
            if after["memory"] > before["memory"]:
                limit = "memory"
            elif after["pids"] > before["pids"]:
                limit = "pids"
            elif code == 128 + signal.SIGXFSZ:
                limit = "file_size"
            elif code == 128 + signal.SIGXCPU:
                limit = "cpu_time"
        if timed_out or len(self._kills) > kills_before or (linger and lingered_code is None):
            code = None
        elif code is not None and code < 0:
            code = 128 - code
        out = buf.getvalue().decode("utf-8", errors="replace")
        return RunResult(output=out, exit_code=code, timed_out=timed_out, duration_sec=time.monotonic() - t0,
                         limit=limit)

    def close(self, *, remove: Sequence[str] = ("app", "tmp", "home")) -> None:
        """Kills everything, removes the cgroup and the listed trial subdirectories (logs are kept)."""
        with self._lock:
            self._closed = True
        self.kill_all()
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        for k in remove:
            remove_tree(self.root / k)
        if self._unsafe:
            _unsafe_release(self)

    # -- the unsafe host backend ---------------------------------------------------------------
    def _popen_unsafe(self, command, *, phase_binds, env, cwd, stdin, stdout, stderr):
        _unsafe_claim(self, phase_binds)
        with self._lock:
            if self._closed:
                raise SandboxError(f"trial sandbox {self.root} is closed")
            script = self._limit_prologue() + 'exec "$@"'
            p = subprocess.Popen(_with_default_signals(["/bin/bash", "-c", script, "jaxrl-unsafe", *command]),
                                 stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True, close_fds=True,
                                 env=env if env is not None else self.env(), cwd=cwd or self.environment.workdir,
                                 **_signal_kwargs())
            self._procs.add(p)
        return p


_RESET_SIGNALS = ("/usr/bin/env", "--default-signal")


_SPAWN_QUEUE: "queue.Queue" = queue.Queue()
_SPAWNER: list = []
_SPAWNER_LOCK = threading.Lock()


def _spawner_loop() -> None:
    while True:
        fn, box, ev = _SPAWN_QUEUE.get()
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 -- handed to the caller
            box.append((False, e))
        ev.set()


def _spawn(fn):
    """Runs `fn` (a Popen) on one long-lived thread. bwrap's --die-with-parent is PR_SET_PDEATHSIG,
    which fires when the *thread* that forked it exits: a sandbox instance started from a short-lived
    agent thread (a lingering oracle, the persistent shell) would die with that thread."""
    with _SPAWNER_LOCK:
        if not _SPAWNER or not _SPAWNER[0].is_alive():
            t = threading.Thread(target=_spawner_loop, daemon=True, name="jaxrl-sandbox-spawner")
            t.start()
            _SPAWNER[:] = [t]
    box: list = []
    ev = threading.Event()
    _SPAWN_QUEUE.put((fn, box, ev))
    ev.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _default_signals() -> None:
    """`preexec_fn` fallback of `_signal_kwargs`: default dispositions and an empty signal mask."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN,
                signal.SIGTTOU, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


@functools.lru_cache(maxsize=None)
def _env_resets_signals() -> bool:
    """True when this host's ``env`` has ``--default-signal`` (GNU coreutils >= 8.31), checked once."""
    try:
        return subprocess.run([*_RESET_SIGNALS, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _with_default_signals(argv: list[str]) -> list[str]:
    """`argv` started through ``env --default-signal``, which execs it with every signal at its default
    disposition and unblocked.

    Why: a child inherits ignored signals and the blocked-signal mask of the thread that forks it, and
    an interactive bash cannot undo an ignored SIGINT. Started from a process that ignores or blocks
    SIGINT (nohup-like launchers, some schedulers, a host thread with a mask), the agent's Ctrl-C
    would then never stop a command in the trial's shell. ``env`` does the reset after exec, so the
    fork itself runs no Python code: a `preexec_fn` in the multithreaded trainer (JAX, env worker
    threads) could deadlock the child before exec. Hosts whose ``env`` lacks the option (coreutils
    < 8.31, e.g. RHEL 8) get the same reset from `_signal_kwargs`' `preexec_fn` instead."""
    return [*_RESET_SIGNALS, *argv] if _env_resets_signals() else list(argv)


def _signal_kwargs() -> dict:
    """Popen keyword arguments completing `_with_default_signals`: none where ``env`` resets the
    signals, else ``preexec_fn=_default_signals`` (the same reset, done in the forked child)."""
    return {} if _env_resets_signals() else {"preexec_fn": _default_signals}


# The unsafe host backend maps the sandbox paths with symlinks at the filesystem root; one trial at a
# time (a process-wide lock held from the first command to close()).
_UNSAFE_LOCK = threading.Lock()
_UNSAFE_OWNER: list = [None, None]
_UNSAFE_LINKS = ("/app", "/tests", "/solution", "/logs", SANDBOX_HOME)


def _unsafe_link(target: str, link: str) -> None:
    if os.path.islink(link):
        os.unlink(link)
    elif os.path.exists(link):
        raise SandboxError(f"{UNSAFE_HOST_BACKEND}: {link} exists on this host and is not a symlink; the unsafe "
                           "backend only runs on disposable machines where it may own /app, /logs, /tests, /solution")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(target, link)


_UNSAFE_LOCKFILE = "/tmp/jaxrl-unsafe-host.lock"


def _unsafe_claim(sb: "Sandbox", phase_binds) -> None:
    if _UNSAFE_OWNER[0] is not sb:
        import fcntl

        _UNSAFE_LOCK.acquire()
        try:
            fd = os.open(_UNSAFE_LOCKFILE, os.O_CREAT | os.O_RDWR, 0o666)
        except OSError as e:
            _UNSAFE_LOCK.release()
            raise SandboxError(f"{UNSAFE_HOST_BACKEND}: cannot open the machine-wide lock {_UNSAFE_LOCKFILE} "
                               f"({e.strerror}); it needs root on a disposable machine") from None
        fcntl.flock(fd, fcntl.LOCK_EX)  # one unsafe trial per machine, across processes
        _UNSAFE_OWNER[:] = [sb, fd]
        log.warning("%s: running trial %s WITHOUT ANY ISOLATION on this host", UNSAFE_HOST_BACKEND, sb.root.name)
        try:
            _unsafe_link(str(sb.dirs["app"]), "/app")
            _unsafe_link(str(sb.root / "logs"), "/logs")
            _unsafe_link(str(sb.dirs["home"]), SANDBOX_HOME)
        except OSError as e:
            _unsafe_release(sb)
            raise SandboxError(f"{UNSAFE_HOST_BACKEND}: cannot create the /app, /logs, {SANDBOX_HOME} links "
                               f"({e}); it needs root on a disposable machine") from None
    for link in ("/tests", "/solution"):
        if os.path.islink(link):
            os.unlink(link)
    for src, dest, _ in phase_binds:
        if dest in ("/tests", "/solution"):
            _unsafe_link(str(src), dest)


def _unsafe_release(sb: "Sandbox") -> None:
    if _UNSAFE_OWNER[0] is sb:
        for link in _UNSAFE_LINKS:
            if os.path.islink(link):
                os.unlink(link)
        fd = _UNSAFE_OWNER[1]
        _UNSAFE_OWNER[:] = [None, None]
        os.close(fd)  # releases the flock
        _UNSAFE_LOCK.release()


def _unsafe_kill_session(procs) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
