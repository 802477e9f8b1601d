"""Running many trials at once, and the verifier sanity gate.

`run_trial(task, agent)` is Harbor's `Trial.run`: start, the agent (a callable taking the `Trial`)
with its time budget, verification (also after an agent timeout), close. An agent that raises
`AgentStop` (or any exception) ends the trial unverified with `agent_error` /
`context_length_exceeded`; a `SandboxError` gives `sandbox_error`. The agent runs in its own thread,
so an agent stuck outside the sandbox (e.g. waiting on a generation request) cannot hold the trial
past its deadline: at the deadline the trial's processes are killed, later agent calls raise
`AgentTimeoutError`, and the verifier runs.

`run_trials(jobs, concurrency=N)` runs `(task, agent)` jobs on N worker threads (default: the
number of usable CPU cores); `arun_trials` is the same for asyncio code. Trials are independent
processes, so threads are enough: the Python side only waits.

`check_tasks(tasks)` is the verifier sanity gate: for every task, the oracle (`solution/solve.sh`,
must get reward 1) and the empty agent (does nothing, must get reward 0), all in parallel. A task
fails the gate when the oracle is missing or does not earn exactly 1.0 with outcome ok, or when the
empty agent earns anything but exactly 0.0 with outcome ok (an inverted verifier pays 1 for an empty
/app; a verifier that writes no reward on failure is also reported).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import re
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from jaxrl.envs.harbor.errors import AgentTimeoutError, SandboxError
from jaxrl.envs.harbor.outcomes import AgentStop, Outcome, TrialResult
from jaxrl.envs.harbor.task import HarborTask
from jaxrl.envs.harbor.trial import Trial, TrialConfig

log = logging.getLogger(__name__)

Agent = Callable[[Trial], None]
AGENT_GRACE_SEC = 5.0  # how long past the deadline a stuck agent thread is waited for


def default_concurrency() -> int:
    """The number of CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def empty_agent(trial: Trial) -> None:
    """Does nothing: the verifier sees /app as the environment left it."""


def oracle_agent(trial: Trial) -> None:
    """Runs the task's solution/solve.sh; its output (capped as every command's) and exit status go to
    the trial's `logs/agent/oracle.txt`, as Harbor's oracle agent writes them."""
    r = trial.run_oracle()
    from jaxrl.fileio import atomic_write_text

    try:
        atomic_write_text(str(trial.sandbox.dirs["logs/agent"] / "oracle.txt"),
                          f"{r.output}\n[exit status {r.exit_code}{', timed out' if r.timed_out else ''}]\n")
    except OSError as e:  # the trial was closed under it (an interrupted run): nothing to keep
        log.debug("trial %s: oracle.txt not written: %s", trial.name, e)


def run_trial(task: HarborTask, agent: Optional[Agent] = None, *, config: TrialConfig = TrialConfig(),
              trial_dir: Optional[str | os.PathLike] = None, name: Optional[str] = None) -> TrialResult:
    """Runs one trial to the end (module docstring) and returns its result; never raises for a task,
    agent or sandbox failure (they are outcomes)."""
    agent = agent or empty_agent
    trial = Trial(task, trial_dir, config, name)
    with _LIVE_LOCK:
        _LIVE_TRIALS.add(trial)
    try:
        return _run(trial, agent)
    finally:
        with _LIVE_LOCK:
            _LIVE_TRIALS.discard(trial)


_LIVE_TRIALS: set = set()  # the trials `run_trial` is running (closed at once when run_trials is interrupted)
_LIVE_LOCK = threading.Lock()


def _run(trial: Trial, agent: Agent) -> TrialResult:
    try:
        trial.start()
    except SandboxError as e:
        log.warning("trial %s: the sandbox did not start: %s", trial.name, e)
        return trial.close()
    errors: list[BaseException] = []

    def body():
        try:
            agent(trial)
        except AgentTimeoutError:
            pass
        except BaseException as e:  # noqa: BLE001 - recorded as an outcome
            errors.append(e)

    th = threading.Thread(target=body, daemon=True, name=f"jaxrl-agent-{trial.name}")
    th.start()
    th.join(timeout=None if trial.agent_time_left == float("inf") else trial.agent_time_left + AGENT_GRACE_SEC)
    if th.is_alive():
        log.warning("trial %s: the agent did not return by its deadline; verifying without it", trial.name)
        trial._end_agent_phase(timed_out=True)
    if trial._phase == "closed":  # closed under the agent (run_trials was interrupted): nothing left to do
        return trial.close()
    verify = True
    if errors:
        e = errors[0]
        if isinstance(e, AgentStop):
            trial.stop_agent(e.outcome, str(e))
            verify = False
        elif isinstance(e, SandboxError):
            trial._sandbox_error = trial._sandbox_error or str(e)
            verify = False
        else:
            log.warning("trial %s: the agent raised %s", trial.name, "".join(traceback.format_exception(e))[-2000:])
            trial.stop_agent(Outcome.AGENT_ERROR, f"{type(e).__name__}: {e}")
            verify = False
    if verify:
        trial.verify()
    return trial.close()


def run_trials(jobs: Iterable[tuple[HarborTask, Optional[Agent]]], *, config: TrialConfig = TrialConfig(),
               concurrency: Optional[int] = None, trials_dir: Optional[str | os.PathLike] = None,
               on_result: Optional[Callable[[TrialResult], None]] = None) -> list[TrialResult]:
    """Runs `(task, agent)` jobs with at most `concurrency` trials at once (default
    `default_concurrency()`); returns the results in job order.

    Args:
      jobs: the trials to run (agent None = the empty agent).
      config: the trial configuration.
      concurrency: trials in flight.
      trials_dir: where trial directories go (default: a temporary directory removed at the end; the
        results are returned in memory).
      on_result: called (from a worker thread) as each trial finishes.
    """
    jobs = list(jobs)
    config.validate()
    n = default_concurrency() if concurrency is None else concurrency
    if n < 1:
        raise ValueError(f"concurrency={concurrency}: must be >= 1")
    root = Path(trials_dir) if trials_dir is not None else Path(tempfile.mkdtemp(prefix="jaxrl-trials-"))
    root.mkdir(parents=True, exist_ok=True)
    if config.sandbox.host_uid is not None:
        os.chmod(root, 0o711)

    def one(job):
        task, agent = job
        r = run_trial(task, agent, config=config, trial_dir=root / _unique(task))
        if on_result is not None:
            on_result(r)
        return r

    ex = concurrent.futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix="jaxrl-trials")
    try:
        futures = [ex.submit(one, job) for job in jobs]
        try:
            return [f.result() for f in futures]
        except KeyboardInterrupt:  # Ctrl-C: stop the running trials now instead of waiting for them to end
            ex.shutdown(wait=False, cancel_futures=True)
            with _LIVE_LOCK:
                live = list(_LIVE_TRIALS)
            for trial in live:
                trial.close()
            raise
    finally:
        ex.shutdown(wait=True)
        if trials_dir is None:
            from jaxrl.envs.harbor.fsutil import remove_tree

            remove_tree(root)


_COUNTER = iter(range(1 << 62))
_COUNTER_LOCK = threading.Lock()


def _unique(task: HarborTask) -> str:
    import re

    with _COUNTER_LOCK:
        i = next(_COUNTER)
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', task.name)[:32]}__{os.getpid()}-{i}"


async def arun_trials(jobs: Iterable[tuple[HarborTask, Optional[Agent]]], *, config: TrialConfig = TrialConfig(),
                      concurrency: Optional[int] = None,
                      trials_dir: Optional[str | os.PathLike] = None) -> list[TrialResult]:
    """`run_trials` for asyncio code: the trials run on worker threads, the event loop stays free."""
    return await asyncio.to_thread(run_trials, jobs, config=config, concurrency=concurrency, trials_dir=trials_dir)


@dataclasses.dataclass
class TaskCheck:
    """The sanity-gate result of one task."""

    task_name: str
    oracle: Optional[TrialResult]
    empty: Optional[TrialResult]
    problems: list[str]
    stage: str = "gate"  # where it failed: "build" (its image; no trial ran) or "gate"

    @property
    def passed(self) -> bool:
        return not self.problems


# What a verifier's output says about why it could not run, most basic cause first (a verifier that
# downloads its test tools fails to resolve the host, then fails to find the tool).
_VERIFIER_CAUSES = (
    ("verifier needs the network",
     re.compile(r"Could not resolve host|Temporary failure in name resolution|Name or service not known|"
                r"Network is unreachable|Failed to establish a new connection|getaddrinfo failed|"
                r"No matching distribution found|Could not find a version that satisfies the requirement"),
     "the verifier needs the network, which the sandbox does not give (no network unless the task sets "
     "allow_internet): install its tools in the task's environment instead"),
    # uv (from the tool mirror, or the image's) with no Python in the image: online it downloads one
    ("verifier needs a Python download",
     re.compile(r"No interpreter found (?:in managed installations or search path|for Python)"),
     "the verifier's uv finds no Python in the image and cannot download one without network: install "
     "python3 in the task's environment"),
    ("verifier program missing", re.compile(r"(?m)([\w./+-]+): (?:command )?not found\s*$"),
     "the verifier runs `{0}`, which the task's environment does not have"),
    ("verifier Python module missing", re.compile(r"No module named '?([\w.]+)'?"),
     "the verifier's Python has no module `{0}`"),
    ("verifier permission", re.compile(r"are you root\?|Permission denied"),
     "the verifier needs a permission the sandbox does not give (it runs as an unprivileged user)"),
)


def verifier_cause(r: TrialResult) -> str:
    """Why a verifier that ran to the end paid what it paid, from its exit status and the tail of its
    output (`test-stdout.txt`): a missing network, program, Python module or permission when the
    output shows one (with the line that shows it), else the output's last line.

    Returns:
      One line, e.g. "verifier exit 127: the verifier runs `uvx`, which the task's environment does not
      have (`/tests/test.sh: line 3: uvx: command not found`)"; "" when the verifier did not run.
    """
    if r.verifier_exit_code is None and not r.test_output:
        return ""
    head = f"verifier exit {r.verifier_exit_code}" if r.verifier_exit_code is not None else "verifier"
    name, line, why = _verifier_cause(r)
    if why:
        return f"{head}: {why} (`{line[:120]}`)"
    if not line:
        return f"{head}, no output"
    return f"{head}, its output ends `{line[:120]}`"


def _verifier_cause(r: TrialResult) -> tuple[str, str, str]:
    """(cause name, the output line that shows it, the sentence) of `verifier_cause`; the name is
    "verifier output" and the sentence "" when no pattern matches (the line is then the last one)."""
    lines = [ln.strip() for ln in r.test_output.splitlines() if ln.strip()]
    for name, pattern, why in _VERIFIER_CAUSES:
        for ln in lines:
            m = pattern.search(ln)
            if m:
                return name, ln, why.format(*m.groups())
    return "verifier output", (lines[-1] if lines else ""), ""


def gate_cause(c: "TaskCheck") -> str:
    """One short cause name for a failing `TaskCheck` (the funnel's gate stage): "no oracle", "oracle
    <outcome>" (the trial failed before a reward), the verifier's cause when the oracle's reward is not 1
    ("verifier needs the network", "verifier program missing", ..., else "oracle reward below 1"), or
    "empty agent rewarded"; "" for a passing one."""
    if c.passed:
        return ""
    if c.stage == "build":
        return "build"
    o = c.oracle
    if o is None:
        return "no oracle"
    if o.outcome != Outcome.OK:
        return f"oracle {o.outcome}"
    if o.reward != 1.0:
        name, _, why = _verifier_cause(o)
        return name if why else "oracle reward below 1"
    return "empty agent rewarded" if c.empty is not None and c.empty.reward > 0 else f"empty agent {c.empty.outcome}"


def _describe(r: TrialResult) -> str:
    s = f"reward {r.reward:g} ({r.outcome})"
    if r.error and r.outcome != Outcome.OK:  # whole, up to 600 characters: the fix and the log path are at its end
        s += f": {r.error if len(r.error) <= 600 else r.error[:300] + ' ... ' + r.error[-295:]}"
    return s


def check_tasks(tasks: Sequence[HarborTask], *, config: TrialConfig = TrialConfig(keep="none"),
                concurrency: Optional[int] = None, trials_dir: Optional[str | os.PathLike] = None) -> list[TaskCheck]:
    """The verifier sanity gate (module docstring): oracle and empty agent for every task, in parallel.

    Tasks on the image backend are built first (`build_images`), each image once; a task whose build
    fails gets one `TaskCheck` with `stage="build"` and the build's message, and no trial.

    Returns:
      One `TaskCheck` per task, in task order.
    """
    build_errors, pinned = build_images(tasks, config)
    try:
        return _gate(tasks, config, concurrency, trials_dir, build_errors)
    finally:
        if pinned:
            from jaxrl.envs.harbor.image_cache import image_cache

            cache = image_cache(config.images)
            for tag in pinned:
                cache.release(tag)
            cache.evict()


def _gate(tasks, config, concurrency, trials_dir, build_errors) -> list[TaskCheck]:
    jobs = []
    for t in tasks:
        if str(t.path) in build_errors:
            continue
        if t.has_oracle:
            jobs.append((t, oracle_agent))
        jobs.append((t, empty_agent))
    results = iter(run_trials(jobs, config=config, concurrency=concurrency, trials_dir=trials_dir))
    checks = []
    for t in tasks:
        if str(t.path) in build_errors:
            checks.append(TaskCheck(t.name, None, None, [f"build: {build_errors[str(t.path)]}"], stage="build"))
            continue
        oracle = next(results) if t.has_oracle else None
        empty = next(results)
        problems = []
        if oracle is None:
            problems.append("no oracle (solution/solve.sh)")
        elif not (oracle.outcome == Outcome.OK and oracle.reward == 1.0):
            cause = verifier_cause(oracle) if oracle.outcome == Outcome.OK else ""
            problems.append(f"oracle: {_describe(oracle)}, expected reward 1" + (f"; {cause}" if cause else ""))
        if not (empty.outcome == Outcome.OK and empty.reward == 0.0):
            hint = " (inverted verifier?)" if empty.reward > 0 else ""
            problems.append(f"empty agent: {_describe(empty)}, expected reward 0{hint}")
        checks.append(TaskCheck(t.name, oracle, empty, problems))
    return checks


def build_images(tasks: Sequence[HarborTask], config: TrialConfig = TrialConfig()) -> tuple[dict, list]:
    """Builds (or finds in the cache) the image of every task on the image backend, and the image of its
    separate verifier (`tests/Dockerfile`), `config.images.build_concurrency` builds at a time, each
    context once, before any trial starts. Each image is pinned in the cache (`ImageCache.acquire`),
    so the least-recently-used eviction of a later build cannot remove an image this run still needs;
    the caller releases the pinned tags. When the run's images together exceed the cache cap, a
    warning says so (the cap is enforced again once they are released).

    Returns:
      (`{str(task.path): the build's one-line error}` for the tasks whose build failed, the pinned tags).
    """
    from jaxrl.envs.harbor.builders import ImageBuildError
    from jaxrl.envs.harbor.image_cache import image_cache
    from jaxrl.envs.harbor.images import IMAGE_PROFILE

    todo = [t for t in tasks if t.environment.profile == IMAGE_PROFILE]
    if not todo:
        return {}, []
    cache = image_cache(config.images)
    pinned: list = []
    lock = threading.Lock()

    def one(t):
        try:
            contexts = [None]
            if t.config.verifier_mode == "separate" and (t.tests_dir / "Dockerfile").is_file():
                contexts.append(t.tests_dir)
            for ctx in contexts:
                tag = cache.ensure(t, ctx)
                cache.acquire(tag)
                with lock:
                    pinned.append(tag)
        except ImageBuildError as e:
            return str(t.path), str(e)
        return str(t.path), None

    with concurrent.futures.ThreadPoolExecutor(max_workers=config.images.build_concurrency,
                                               thread_name_prefix="jaxrl-builds") as ex:
        errors = {name: err for name, err in ex.map(one, todo) if err}
    sizes = {tag: int(cache.index().get(tag, {}).get("size", 0)) for tag in set(pinned)}
    total_mb = sum(sizes.values()) / 1e6
    if total_mb > config.images.max_mb:
        log.warning("the images of this run take %.0f MB, over the image cache cap of %d MB: they are all kept "
                    "until the run ends; raise harbor.image_cache_max_mb (--image-cache-max-mb) to keep them "
                    "for the next run", total_mb, config.images.max_mb)
    return errors, pinned


def format_check_table(checks: Sequence[TaskCheck], *, failures_only: bool = True) -> str:
    """A plain-text table of the gate (the failing tasks, or all): each agent's reward and outcome (the
    error class: ok, reward_missing, ...), the problems, and a summary line."""
    rows = [c for c in checks if not (failures_only and c.passed)]
    lines = []
    if rows:
        def cell(r):
            return "-" if r is None else f"{r.reward:g} {r.outcome}"

        w = max(len("task"), *(len(c.task_name) for c in rows))
        wo = max(len("oracle"), *(len(cell(c.oracle)) for c in rows))
        we = max(len("empty"), *(len(cell(c.empty)) for c in rows))
        lines.append(f"{'task':<{w}}  {'oracle':<{wo}}  {'empty':<{we}}  problem")
        lines.append(f"{'-' * w}  {'-' * wo}  {'-' * we}  {'-' * 7}")
        for c in rows:
            lines.append(f"{c.task_name:<{w}}  {cell(c.oracle):<{wo}}  {cell(c.empty):<{we}}  "
                         f"{'; '.join(c.problems) or 'ok'}")
    n_fail = sum(not c.passed for c in checks)
    lines.append(f"{len(checks) - n_fail}/{len(checks)} tasks pass the gate (oracle reward 1, empty agent reward 0)"
                 + (f"; {n_fail} fail" if n_fail else ""))
    return "\n".join(lines)
