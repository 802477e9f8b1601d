"""What this host allows the sandbox: the bubblewrap probe (`_bwrap_probe`: a full sandbox started
once), the kernel version, the cgroup tree found (`host_info`), and `check_sandbox`, which picks
the limits backend ("cgroup", "rlimit", or "none" for the unsafe host backend) or raises
`SandboxUnavailableError` with the reason and the fix.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re
import shutil
import subprocess
from typing import Optional

from jaxrl.envs.harbor.cgroups import detect_cgroups
from jaxrl.envs.harbor.errors import SandboxUnavailableError
from jaxrl.envs.harbor.sandbox_config import BWRAP, UNSAFE_HOST_BACKEND, SandboxConfig


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
