"""The unsafe host backend (`UNSAFE_HOST_BACKEND`, "UNSAFE_host_no_isolation"): commands run directly
on this host as the current user, without any isolation, for disposable machines where bwrap cannot
run. The sandbox paths (/app, /logs, /tests, /solution, the sandbox home) are symlinks at this
host's filesystem root to the trial's directories, so one trial runs per machine at a time: a
process-wide lock and a machine-wide file lock are held from a trial's first command to its
`close()`. `Sandbox._popen_unsafe` starts the commands.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.sandbox_config import SANDBOX_HOME, UNSAFE_HOST_BACKEND

log = logging.getLogger(__name__)


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


def _unsafe_claim(sb: "Sandbox", phase_binds) -> None:  # noqa: F821 (sandbox.Sandbox)
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


def _unsafe_release(sb: "Sandbox") -> None:  # noqa: F821 (sandbox.Sandbox)
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
