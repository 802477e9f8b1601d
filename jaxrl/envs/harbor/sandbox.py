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

Where the pieces live: the settings and limits in `sandbox_config.py`, the host checks
(`check_sandbox`) in `host.py`, the trial cgroups in `cgroups.py`, the seccomp filter in
`seccomp.py`, /opt/jaxrl and the curated /etc in `profile_dir.py`, the no-follow host-side file
helpers in `fsutil.py`, process start-up (spawner thread, signal reset) in `spawn.py`, and the unsafe
host backend in `unsafe.py`; this module holds the `Sandbox` itself.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.cgroups import _LIVE_CGROUPS, TrialCgroup, detect_cgroups  # noqa: F401
from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.fsutil import disk_usage, read_file_nofollow, remove_tree  # noqa: F401
from jaxrl.envs.harbor.host import HostInfo, _root_links, check_sandbox, host_info  # noqa: F401
from jaxrl.envs.harbor.profile_dir import _PROFILE_DIRS, PROMPT_MARK, _profile_dir  # noqa: F401
from jaxrl.envs.harbor.profiles import SANDBOX_PATH, EnvironmentSpec, get_profile
from jaxrl.envs.harbor.python_runtime import find_python
from jaxrl.envs.harbor.sandbox_config import (BWRAP, PIP_MIRROR_MOUNT, SANDBOX_HOME,  # noqa: F401
                                              UNSAFE_HOST_BACKEND, Limits, SandboxConfig)
from jaxrl.envs.harbor.seccomp import (_SECCOMP_FILE, SECCOMP_DENY, SECCOMP_DENY_IOCTLS, _seccomp_file,  # noqa: F401
                                       seccomp_program)
from jaxrl.envs.harbor.spawn import _env_resets_signals, _signal_kwargs, _spawn, _with_default_signals  # noqa: F401
from jaxrl.envs.harbor.unsafe import _unsafe_claim, _unsafe_kill_session, _unsafe_release

log = logging.getLogger(__name__)


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
        # "image": the task's own built image (image_sandbox.ImageSandbox), no host profile
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
