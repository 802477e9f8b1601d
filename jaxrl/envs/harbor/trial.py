"""One trial: a task in its own sandbox, an agent phase with a time budget, then the verifier.

Lifecycle (Harbor's `Trial.run`, without Docker)::

    trial = Trial(task, trial_dir, TrialConfig(...)).start()   # directories, /app files, cgroup, agent clock
    trial.exec("ls /app")                  # one-shot command (fresh sandbox instance, output captured)
    trial.send_keys("ls\\n", duration=1)    # the persistent shell (`trial.terminal`), Terminus style
    trial.terminal.read_new_output()
    trial.run_oracle()                     # the oracle agent: bash /solution/solve.sh
    result = trial.verify()                # /tests bound; test.sh (agent processes still run); reward read
    trial.close()                          # every process killed, cgroup removed, result.json written

Time limits: every agent command stops after `command_timeout_sec` (default 60 s, Terminus's cap) or
when the agent budget (`agent_timeout_sec`: the task's `[agent] timeout_sec` unless overridden,
capped by `max_agent_timeout_sec`) is spent, whichever is first. At the agent deadline the agent
phase ends: later agent calls raise `AgentTimeoutError`; the verifier still runs (Harbor's rule) with
its own budget (`[verifier] timeout_sec` unless overridden). The agent's processes (its shell and
background jobs) keep running through verification, as in Harbor's container, and die at `close()`;
`TrialConfig.stop_agent_processes=True` kills them when the agent phase ends instead. The verifier
runs in its own sandbox instance: it sees the agent's files, /tmp and running processes' effects, but
not their network namespace (a server the agent left listening on a TCP port is not reachable).
A task with `[verifier] environment_mode = "separate"` (image backend) is verified in a container of
its own instead, which receives only the task's `artifacts` (`Trial._run_separate_verifier`).


Outcomes (`Outcome`, the column `outcome` of trial_stats.csv), the results and how the reward is
read (`parse_reward`): `outcomes.py`.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from jaxrl.envs.harbor.errors import AgentTimeoutError, SandboxError
from jaxrl.envs.harbor.fsutil import read_file_nofollow, remove_tree
from jaxrl.envs.harbor.image_cache import ImageCacheConfig, image_cache
from jaxrl.envs.harbor.image_sandbox import DEFAULT_PATH, ImageSandbox, collect_artifacts
from jaxrl.envs.harbor.images import IMAGE_PROFILE
from jaxrl.envs.harbor.outcomes import (LIMIT_KINDS, VERIFIED_OUTCOMES, AgentStop, Outcome,  # noqa: F401
                                        TrialResult, VerifierResult, parse_reward)
from jaxrl.envs.harbor.sandbox import RunResult, Sandbox
from jaxrl.envs.harbor.sandbox_config import TOOL_MIRROR_MOUNT, UNSAFE_HOST_BACKEND, Limits, SandboxConfig
from jaxrl.envs.harbor.task import HarborTask
from jaxrl.envs.harbor.terminal import Terminal, TmuxTerminal

log = logging.getLogger(__name__)

ExecResult = RunResult


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """Per-trial settings (seconds).

    Attributes:
      agent_timeout_sec: the agent budget; None = the task's `[agent] timeout_sec` (the 8B recipe
        passes 900).
      verifier_timeout_sec: the verifier budget; None = the task's `[verifier] timeout_sec` (the
        8B recipe passes 120).
      max_agent_timeout_sec / max_verifier_timeout_sec: caps on the above.
      command_timeout_sec: wall clock of one agent command, and the cap on one terminal wait.
      sandbox: isolation and resource caps.
      keep: what stays in the trial directory after `close()`: "logs" (logs/ and result.json), "all",
        or "none" (the directory is removed).
      test_output_tail_bytes: how much of the end of test-stdout.txt goes into the result.
      terminal: the persistent shell: "pty" (a bash on a pty, `terminal.Terminal`) or "tmux" (a
        real tmux session with Harbor's pane size, `terminal.TmuxTerminal`: terminus-2's screen).
      stop_agent_processes: kill the agent's processes (its shell, background jobs) when the agent
        phase ends, before the verifier runs. Default False, as Harbor: they keep running through
        verification (a task may ask for a running process) and die at `close()`.
      images: the image cache of tasks on the image backend (`image_cache.ImageCacheConfig`: base-image map,
        size cap, build concurrency).
    """

    agent_timeout_sec: Optional[float] = None
    verifier_timeout_sec: Optional[float] = None
    max_agent_timeout_sec: float = 3600.0
    max_verifier_timeout_sec: float = 3600.0
    command_timeout_sec: float = 60.0
    sandbox: SandboxConfig = SandboxConfig()
    keep: str = "logs"
    test_output_tail_bytes: int = 4096
    stop_agent_processes: bool = False
    terminal: str = "pty"
    images: ImageCacheConfig = ImageCacheConfig()

    def validate(self) -> None:
        """Raises ValueError naming the field and the fix."""
        for k in ("agent_timeout_sec", "verifier_timeout_sec"):
            v = getattr(self, k)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{k}={v!r}: a positive number of seconds, or None for the task's value")
        for k in ("max_agent_timeout_sec", "max_verifier_timeout_sec", "command_timeout_sec"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{k}={v!r}: must be a positive number of seconds")
        if self.terminal not in ("pty", "tmux"):
            raise ValueError(f"terminal={self.terminal!r}: use 'pty' or 'tmux'")
        if self.keep not in ("logs", "all", "none"):
            raise ValueError(f"keep={self.keep!r}: use 'logs', 'all' or 'none'")
        self.sandbox.validate()
        self.images.validate()


def _trial_name(task_name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task_name)[:32]
    return f"{safe}__{uuid.uuid4().hex[:7]}"


class Trial:
    """A task in its own sandbox (module docstring). Thread-safe: agent calls may come from one
    thread while the monitor thread enforces the deadline and the disk limit.

    Args:
      task: the task.
      trial_dir: the trial directory (created if missing, must be empty; default: a new temporary
        directory, removed at `close()` only with `keep="none"`).
      config: timeouts, sandbox settings.
      name: the trial name (default `<task[:32]>__<7 hex>`, as Harbor).
    """

    def __init__(self, task: HarborTask, trial_dir: Optional[str | os.PathLike] = None,
                 config: TrialConfig = TrialConfig(), name: Optional[str] = None):
        config.validate()
        self.task = task
        self.config = config
        self.name = name or _trial_name(task.name)
        if trial_dir is None:
            import tempfile

            trial_dir = tempfile.mkdtemp(prefix=f"jaxrl-trial-{self.name}-")
        self.dir = Path(trial_dir).absolute()
        tc = task.config
        agent_t = config.agent_timeout_sec if config.agent_timeout_sec is not None else tc.agent_timeout_sec
        self.agent_timeout_sec = min(agent_t if agent_t is not None else math.inf, config.max_agent_timeout_sec)
        ver_t = config.verifier_timeout_sec if config.verifier_timeout_sec is not None else tc.verifier_timeout_sec
        self.verifier_timeout_sec = min(ver_t, config.max_verifier_timeout_sec)
        self.limits = Limits.for_task(tc, config.sandbox)
        if task.environment.profile == IMAGE_PROFILE:
            self.sandbox = ImageSandbox(self.dir, task.environment, self.limits, config.sandbox,
                                        allow_internet=tc.allow_internet, task=task, cache=image_cache(config.images))
        else:
            self.sandbox = Sandbox(self.dir, task.environment, self.limits, config.sandbox,
                                   allow_internet=tc.allow_internet)
        self.info: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._phase = "new"  # new -> agent -> verifying -> done -> closed
        self._terminal: Optional[Terminal] = None
        self._t_start = 0.0
        self._deadline = math.inf
        self._agent_end: Optional[float] = None
        self._agent_timed_out = False
        self._agent_stop: Optional[AgentStop] = None
        self._sandbox_error = ""
        self._limits_hit: dict[str, int] = {}
        self._n_commands = 0
        self._verifier: Optional[VerifierResult] = None
        self._monitor: Optional[threading.Thread] = None
        self._stop_monitor = threading.Event()
        self._started_at = ""
        self._counters = {"memory": 0, "pids": 0}
        self._over_disk = False  # the monitor's last check found the trial over its disk limit
        self._disk_base = (0, 0)  # (bytes, entries) at the start of verification: the verifier's allowance is on top

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> "Trial":
        """Prepares the sandbox and starts the agent clock.

        Raises:
          SandboxError: the sandbox cannot be prepared (recorded as `sandbox_error` too).
        """
        with self._lock:
            if self._phase != "new":
                raise SandboxError(f"trial {self.name} was already started")
            try:
                self.sandbox.prepare()
            except SandboxError as e:
                self._sandbox_error = str(e)
                self._phase = "done"
                raise
            self._phase = "agent"
            self._started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            self._t_start = time.monotonic()
            self._deadline = self._t_start + self.agent_timeout_sec
        self._monitor = threading.Thread(target=self._watch, daemon=True, name=f"jaxrl-trial-{self.name}")
        self._monitor.start()
        return self

    def __enter__(self) -> "Trial":
        return self.start() if self._phase == "new" else self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def agent_time_left(self) -> float:
        """Seconds left in the agent budget (0 once the agent phase is over)."""
        if self._phase != "agent":
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    @property
    def agent_deadline(self) -> float:
        """The agent deadline as a `time.monotonic()` value."""
        return self._deadline

    @property
    def timed_out(self) -> bool:
        return self._agent_timed_out

    def _hit(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._limits_hit[kind] = self._limits_hit.get(kind, 0) + n

    def _watch(self) -> None:
        interval = self.config.sandbox.disk_check_interval_sec
        while not self._stop_monitor.wait(interval):
            with self._lock:
                phase = self._phase
            if phase not in ("agent", "verifying"):
                continue
            if phase == "agent" and time.monotonic() >= self._deadline:
                self._end_agent_phase(timed_out=True)
                continue
            why = self.sandbox.over_disk(self._disk_base if phase == "verifying" else (0, 0))
            with self._lock:
                if self._phase != phase:  # verify() began meanwhile (it resets the crossing): this check is stale
                    continue
                if not why:
                    self._over_disk = False
                    continue
                # one `disk` event per crossing of the limit: the files stay until the agent removes
                # them, so later checks still see the trial over it (they still kill what runs)
                crossed = not self._over_disk
                self._over_disk = True
                if crossed:
                    self._hit("disk")
            if crossed:
                log.info("trial %s: %s; killing its processes", self.name, why)
            if self._terminal is not None:
                self._terminal.close()
            self.sandbox.kill_all("disk")

    def _require_agent_phase(self) -> None:
        with self._lock:
            phase, timed_out = self._phase, self._agent_timed_out
        if phase == "new":
            raise SandboxError(f"trial {self.name} is not started (call start())")
        if timed_out or (phase == "agent" and time.monotonic() >= self._deadline):
            self._end_agent_phase(timed_out=True)
            raise AgentTimeoutError(f"trial {self.name}: the agent budget of {self.agent_timeout_sec:.0f} s is spent")
        if phase != "agent":
            raise SandboxError(f"trial {self.name}: the agent phase is over ({phase})")

    def _end_agent_phase(self, timed_out: bool = False) -> None:
        with self._lock:
            if self._phase != "agent":
                return
            self._phase = "ending"
            self._agent_end = time.monotonic()
            if timed_out:
                self._agent_timed_out = True
                log.info("trial %s: agent timeout after %.1f s", self.name, self._agent_end - self._t_start)
            term = self._terminal
        self._count_cgroup_limits()
        if self.config.stop_agent_processes:
            if term is not None:
                term.close()
            self.sandbox.kill_all("agent_timeout" if timed_out else "agent_done")
        with self._lock:
            self._phase = "agent_over"

    # -- the agent's interface -------------------------------------------------------------------------
    def exec(self, command: str, timeout: Optional[float] = None, *, env: Optional[dict] = None,
             cwd: Optional[str] = None) -> ExecResult:
        """Runs a shell command (`bash -c`) in a fresh sandbox instance of this trial and waits for it.

        Background processes it starts die when it returns (use the terminal for long-lived ones).

        Args:
          command: the shell command.
          timeout: seconds (default `command_timeout_sec`); also cut at the agent deadline.
          env: extra environment variables.
          cwd: the working directory (default the task's WORKDIR, /app).

        Returns:
          The `ExecResult` (output, exit_code, timed_out, duration_sec, limit).

        Raises:
          AgentTimeoutError: the agent budget is spent (before or while it ran).
          SandboxError: the trial is not in its agent phase or the sandbox failed.
        """
        return self._exec(command, timeout, env=env, cwd=cwd)

    def _exec(self, command: str, timeout: Optional[float], *, env=None, cwd=None, phase_binds=(),
              linger: bool = False) -> ExecResult:
        self._require_agent_phase()
        t = self.config.command_timeout_sec if timeout is None else float(timeout)
        left = self.agent_time_left
        cut_by_deadline = left <= t
        with self._lock:
            self._n_commands += 1
        try:
            res = self.sandbox.run(["/bin/bash", "-c", command], timeout=min(t, left), phase_binds=phase_binds,
                                   env=self.sandbox.env(env), cwd=cwd, watch_disk=False, linger=linger)
        except SandboxError as e:
            self._sandbox_error = self._sandbox_error or str(e)
            raise
        if res.limit == "agent_timeout" or (res.timed_out and cut_by_deadline):
            self._end_agent_phase(timed_out=True)
            raise AgentTimeoutError(f"trial {self.name}: the agent budget of {self.agent_timeout_sec:.0f} s ran out "
                                    f"during `{command[:80]}`")
        if res.limit in ("timeout", "file_size", "cpu_time"):  # disk: the monitor; memory, pids: the cgroup
            self._hit(res.limit)
        self._count_cgroup_limits()
        return res

    @property
    def terminal(self) -> Terminal:
        """The persistent shell (started on first use; lives until the agent phase ends).

        Raises:
          AgentTimeoutError / SandboxError: as `exec`.
        """
        self._require_agent_phase()
        with self._lock:
            if self._terminal is None:
                try:
                    # [environment] build_timeout_sec bounds the environment's start (the shell's here)
                    kind = TmuxTerminal if self.config.terminal == "tmux" else Terminal
                    self._terminal = kind(self.sandbox).start(timeout=float(self.task.config.build_timeout_sec))
                except SandboxError as e:
                    self._sandbox_error = self._sandbox_error or str(e)
                    raise
            return self._terminal

    def send_keys(self, keystrokes: str, duration: float = 1.0) -> float:
        """Sends keystrokes to the persistent shell and waits (`Terminal.send_keys`, at most
        `command_timeout_sec` and never past the agent deadline). Returns the seconds waited.

        Raises:
          AgentTimeoutError: the agent budget is spent.
          SandboxError: the shell has exited (e.g. the agent typed `exit`; `trial.terminal.is_alive()`
            tells beforehand), or the trial is not in its agent phase.
        """
        term = self.terminal
        if not term.is_alive():
            raise SandboxError(f"trial {self.name}: the shell exited")
        with self._lock:
            self._n_commands += 1
        waited = term.send_keys(keystrokes, duration, max_duration=self.config.command_timeout_sec,
                                deadline=self._deadline)
        self._count_cgroup_limits()
        if time.monotonic() >= self._deadline:
            self._end_agent_phase(timed_out=True)
            raise AgentTimeoutError(f"trial {self.name}: the agent budget of {self.agent_timeout_sec:.0f} s is spent")
        return waited

    def _count_cgroup_limits(self) -> None:
        """Counts one `memory` / `pids` event per agent call during which the cgroup's OOM-kill /
        refused-fork counter grew."""
        if self.sandbox.cgroup is None:
            return
        with self._lock:
            now = self.sandbox.counters()
            for k in ("memory", "pids"):
                if now[k] > self._counters[k]:
                    self._limits_hit[k] = self._limits_hit.get(k, 0) + 1
            self._counters = now

    def run_oracle(self) -> ExecResult:
        """The oracle agent: runs `bash /solution/solve.sh` (with `[solution] env`, /solution bound
        read-only) with the rest of the agent budget as its timeout.

        Raises:
          SandboxError: the task has no solution/solve.sh, or as `exec`.
          AgentTimeoutError: as `exec`.
        """
        if not self.task.has_oracle:
            raise SandboxError(f"task {self.task.name} has no solution/solve.sh")
        left = self.agent_time_left
        return self._exec("bash /solution/solve.sh", timeout=left if left < math.inf else None,
                          env=self.task.config.solution_env,
                          phase_binds=[(str(self.task.solution_dir), "/solution", False)],
                          linger=not self.config.stop_agent_processes)

    def stop_agent(self, outcome: Outcome | str, message: str = "") -> None:
        """Records that the agent ended the trial without verification (`agent_error`,
        `context_length_exceeded` or `output_length_exceeded`), and ends the agent phase."""
        self._agent_stop = AgentStop(Outcome(outcome), message)
        self._end_agent_phase()

    def record_sandbox_error(self, message: str) -> None:
        """Records an infrastructure failure seen by the agent (the trial's outcome becomes
        `sandbox_error`, which a trainer masks) and ends the agent phase."""
        with self._lock:
            self._sandbox_error = self._sandbox_error or message
        self._end_agent_phase()

    # -- verification ---------------------------------------------------------------------------------
    def verify(self) -> VerifierResult:
        """Ends the agent phase (its processes keep running unless `stop_agent_processes`), binds /tests (read-only) and a fresh
        /logs/verifier, runs `/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1` with the verifier
        budget and `[verifier] env`, and reads the reward. Never raises for task or sandbox failures:
        they are outcomes."""
        with self._lock:
            if self._verifier is not None:
                return self._verifier
            if self._phase == "new":
                raise SandboxError(f"trial {self.name} is not started (call start())")
        self._end_agent_phase()
        with self._lock:
            self._disk_base = self.sandbox.disk_usage()
            self._over_disk = False
            self._phase = "verifying"
        t0 = time.monotonic()
        try:
            res = self._run_verifier()
        except SandboxError as e:
            self._sandbox_error = self._sandbox_error or str(e)
            res = VerifierResult(0.0, Outcome.SANDBOX_ERROR, {"reason": str(e)})
        res.details["duration_sec"] = time.monotonic() - t0
        with self._lock:
            self._verifier = res
            self._phase = "done"
        return res

    def _copy_tests(self) -> Path:
        """A copy of the task's tests/ in the trial dir (bound read-only at /tests), modes normalised."""
        tests = self.dir / "tests"
        remove_tree(tests)
        shutil.copytree(self.task.tests_dir, tests, symlinks=True)
        for dirpath, dirnames, filenames in os.walk(tests):
            os.chmod(dirpath, 0o755)
            for n in filenames:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    os.chmod(p, 0o755 if n.endswith(".sh") or os.stat(p).st_mode & 0o111 else 0o644)
        return tests

    def _run_verifier(self) -> VerifierResult:
        if self.task.config.verifier_mode == "separate":
            return self._run_separate_verifier()
        sb = self.sandbox
        vdir = sb.dirs["logs/verifier"]
        remove_tree(vdir)
        vdir.mkdir()
        tests = self._copy_tests()
        uid = self.config.sandbox.host_uid
        if uid is not None:
            os.chown(vdir, uid, uid)
        return self._run_test_sh(sb, vdir, [(str(tests), "/tests", False), (str(vdir), "/logs/verifier", True)],
                                 watch_disk=False)

    def _run_separate_verifier(self) -> VerifierResult:
        """Harbor 0.26's separate verifier (`environment_mode = "separate"`): the artifacts are copied out of
        the agent's container (`ImageSandbox.copy_out`: nothing followed, symlinks and special files
        skipped), a fresh container is made of the verifier image (`tests/Dockerfile` built with `tests/` as
        its context, which then holds /tests itself; without it, the task's own image with /tests bound),
        each artifact is placed at its own path there, and test.sh runs in it with the verifier budget and
        its own disk limit. The agent's container and processes are left as they are."""
        sb = self.sandbox
        if not isinstance(sb, ImageSandbox):
            raise SandboxError(f"task {self.task.name}: a separate verifier needs the image backend")
        collected, conv, self.info["artifacts"] = collect_artifacts(sb, self.task.config.artifacts,
                                                                     self.dir / "artifacts", self.name)
        bundled = (self.task.tests_dir / "Dockerfile").is_file()
        vsb = ImageSandbox(self.dir / "verifier-env", self.task.environment, self.limits, self.config.sandbox,
                           allow_internet=self.task.config.allow_internet, task=self.task, cache=sb.cache,
                           context=self.task.tests_dir if bundled else None)
        try:
            vsb.prepare()
            for src, path in collected:
                vsb.place(src, path)
            if conv is not None:
                target = vsb.dirs["logs/artifacts"]
                remove_tree(target)
                os.replace(conv, target)
            vdir = vsb.dirs["logs/verifier"]
            binds = [(str(vdir), "/logs/verifier", True)]
            if not bundled:
                binds.insert(0, (str(self._copy_tests()), "/tests", False))
            # Harbor chmods a .sh test script before running it; a tests/ copied by its Dockerfile keeps the
            # checkout's modes (often 0644)
            return self._run_test_sh(vsb, vdir, binds, watch_disk=True, chmod=bundled)
        finally:
            vsb.close()

    def _tool_mirror(self, env: dict) -> list:
        """The binds of `SandboxConfig.tool_mirror` for test.sh ([] without one); appends its bin/ to
        `env["PATH"]` (last: a program the image or the verifier installs comes first)."""
        mirror = self.config.sandbox.tool_mirror
        if mirror is None:
            return []
        mirror = os.path.abspath(mirror)
        if self.config.sandbox.backend == UNSAFE_HOST_BACKEND:  # no mount namespace: the host path itself
            env["PATH"] = f"{env.get('PATH', DEFAULT_PATH)}:{mirror}/bin"
            return []
        env["PATH"] = f"{env.get('PATH', DEFAULT_PATH)}:{TOOL_MIRROR_MOUNT}/bin"
        return [(mirror, TOOL_MIRROR_MOUNT, False)]

    def _run_test_sh(self, sb, vdir: Path, binds: list, *, watch_disk: bool, chmod: bool = False) -> VerifierResult:
        """Runs /tests/test.sh in `sb` with the verifier budget and `[verifier] env`; reads the reward from `vdir`."""
        script = "/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"
        env = sb.env(self.task.config.verifier_env)
        binds = binds + self._tool_mirror(env)
        res = sb.run(["/bin/bash", "-c", ("chmod +x /tests/test.sh 2>/dev/null; " if chmod else "") + script],
                     timeout=self.verifier_timeout_sec, phase_binds=binds, env=env, watch_disk=watch_disk)
        out, _ = read_file_nofollow(vdir, "test-stdout.txt", self.config.test_output_tail_bytes, tail=True)
        details = {"exit_code": res.exit_code,
                   "test_output": (out or b"").decode("utf-8", errors="replace")}
        if res.output.startswith(("bwrap:", "jaxrl sandbox:")):
            raise SandboxError(f"the verifier sandbox failed: {res.output.strip()[:500]}")
        if res.timed_out:
            self._hit("timeout")
            return VerifierResult(0.0, Outcome.VERIFIER_TIMEOUT,
                                  {**details, "reason": f"test.sh ran longer than {self.verifier_timeout_sec:.0f} s"})
        if res.limit in ("timeout", "file_size", "cpu_time"):
            self._hit(res.limit)
        self._count_cgroup_limits()
        value, outcome, d = parse_reward(vdir)
        details.update(d)
        return VerifierResult(value if value is not None else 0.0, outcome, details)

    # -- result ----------------------------------------------------------------------------------------
    def result(self) -> TrialResult:
        """The trial's record so far (outcome precedence: sandbox_error, then a verifier failure,
        then the agent's own stop, then agent_timeout, else ok)."""
        v = self._verifier
        if self._sandbox_error:
            outcome, reward = Outcome.SANDBOX_ERROR, 0.0
        elif self._agent_stop is not None and v is None:
            outcome, reward = self._agent_stop.outcome, 0.0
        elif v is None:  # closed without verification
            outcome, reward = (Outcome.AGENT_TIMEOUT if self._agent_timed_out else Outcome.REWARD_MISSING), 0.0
        elif v.outcome != Outcome.OK:
            outcome, reward = v.outcome, 0.0
        elif self._agent_timed_out:
            outcome, reward = Outcome.AGENT_TIMEOUT, v.reward
        else:
            outcome, reward = Outcome.OK, v.reward
        end = self._agent_end if self._agent_end is not None else time.monotonic()
        error = self._sandbox_error or (str(self._agent_stop) if self._agent_stop else "") or \
            (v.details.get("reason", "") if v is not None and v.outcome != Outcome.OK else "") or \
            ("the trial was closed without verification" if v is None else "")
        return TrialResult(
            task_name=self.task.name, trial_name=self.name, outcome=outcome, reward=float(reward),
            rewards=dict(v.details.get("rewards", {})) if v is not None else {},
            agent_duration_sec=max(0.0, end - self._t_start) if self._t_start else 0.0,
            verifier_duration_sec=float(v.details.get("duration_sec", 0.0)) if v is not None else 0.0,
            n_commands=self._n_commands, limits_hit=dict(self._limits_hit), error=error,
            verifier_exit_code=v.details.get("exit_code") if v is not None else None,
            test_output=v.details.get("test_output", "") if v is not None else "",
            started_at=self._started_at, info=dict(self.info))

    def close(self) -> TrialResult:
        """Kills every process of the trial, removes its cgroup and (per `keep`) its files, writes
        `result.json`, and returns the result. Safe to call twice."""
        with self._lock:
            if self._phase == "closed":
                return self._closed_result
            if self._phase == "agent":
                self._phase = "agent_over"
                self._agent_end = time.monotonic()
        self._stop_monitor.set()
        if self._terminal is not None:
            self._terminal.close()
        remove = {"logs": ("app", "tmp", "home", "tests"), "all": (), "none": ("app", "tmp", "home", "tests")}
        try:
            self.sandbox.close(remove=remove[self.config.keep])
        except Exception as e:  # noqa: BLE001 - never leave a trial half-closed
            log.warning("trial %s: cleanup failed: %s", self.name, e)
        result = self.result()
        if self.config.keep == "none":
            remove_tree(self.dir)
        elif self.dir.exists():
            from jaxrl.fileio import atomic_write_json

            atomic_write_json(str(self.dir / "result.json"), result.to_json())
        with self._lock:
            self._phase = "closed"
            self._closed_result = result
        return result
