"""What a trial's sandbox is allowed: `SandboxConfig` (isolation settings and resource caps, the
`sandbox.*` settings) and `Limits` (one trial's limits: task.toml's values clipped by those caps),
with the names of the backends and the fixed sandbox paths they refer to (`SANDBOX_HOME`,
`PIP_MIRROR_MOUNT`). How the limits are enforced: `sandbox.py`'s module docstring.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional


BWRAP = "bwrap"
UNSAFE_HOST_BACKEND = "UNSAFE_host_no_isolation"
SANDBOX_HOME = "/home/agent"


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
      tool_mirror: a host directory whose `bin/` holds the programs a verifier downloads from a host
        other than a package registry (`launch/make_tool_mirror.sh DIR --uv VER`: uv and uvx from
        PyPI's `uv` wheel, for the `curl https://astral.sh/uv/VER/install.sh | sh` of many verifiers).
        Bound read-only at `/opt/jaxrl-tools` while test.sh runs, its `bin/` last on the verifier's
        PATH (a program the image or the verifier installs itself comes first); the agent never sees it.
        None: no tool mirror.
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
    tool_mirror: Optional[str] = None
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
        if self.tool_mirror is not None and not os.path.isdir(os.path.join(self.tool_mirror, "bin")):
            raise ValueError(f"tool mirror {self.tool_mirror!r} has no bin/ folder: make it with "
                             "`launch/make_tool_mirror.sh DIR --uv VER` (docs/terminal_tasks.md, 'Network'), "
                             "or leave it unset")

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

TOOL_MIRROR_MOUNT = "/opt/jaxrl-tools"
"""Where `SandboxConfig.tool_mirror` is bound while a verifier runs (its `bin/` ends the PATH)."""


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
