"""`python -m jaxrl.tasks`: check, list and run Harbor task sets in the local sandbox.

    python -m jaxrl.tasks check [PATH]         # the verifier sanity gate: oracle -> 1, empty agent -> 0
    python -m jaxrl.tasks list [PATH]          # tasks, profiles, timeouts (or why a task is invalid)
    python -m jaxrl.tasks run-oracle PATH --task NAME [--empty]   # one trial, with the verifier's output
    python -m jaxrl.tasks funnel DIR [DIR ...] [--json OUT]      # how many tasks load, and why not, by cause
    python -m jaxrl.tasks funnel DIR ... --environment-backend image --gate   # ... then build and gate, by cause

PATH is a task directory, a folder of tasks or a DCAgent .parquet file; default: the shipped set.
Exit status of `check`: 0 when every task passes, 1 when some fail, 2 when the set or the sandbox
cannot be used (a one-line reason on stderr).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from jaxrl.envs.harbor import (SHIPPED_TASKS_DIR, UNSAFE_HOST_BACKEND, HarborTaskError, SandboxConfig, SandboxError,
                               TrialConfig, check_sandbox, check_tasks, default_concurrency, empty_agent,
                               format_check_table, load_task_set, oracle_agent, run_trial)
from jaxrl.envs.harbor.image_flags import image_config as _image_config
from jaxrl.envs.harbor.image_flags import image_options_problem
from jaxrl.errors import ArgumentParser


def _trial_config(args, keep: str) -> TrialConfig:
    sb = SandboxConfig(backend=UNSAFE_HOST_BACKEND if args.UNSAFE_no_sandbox else "bwrap",
                       limits_backend=args.limits, host_uid=args.host_uid, pip_mirror=args.pip_mirror,
                       tool_mirror=args.tool_mirror)
    return TrialConfig(agent_timeout_sec=args.agent_timeout, verifier_timeout_sec=args.verifier_timeout,
                       sandbox=sb, keep=keep, stop_agent_processes=args.stop_agent_processes,
                       images=_image_config(args))


def _backend_line(tasks) -> str:
    n = sum(t.environment.profile == "image" for t in tasks)
    return f"environments: {len(tasks) - n} on host profiles, {n} built as images"


def _load(args):
    errors: list = []
    tasks = load_task_set(args.path, extract_dir=args.extract_dir, skip_invalid=args.skip_invalid, errors=errors,
                          environment_backend=args.environment_backend)
    for src, msg in errors:
        print(f"invalid task skipped: {msg}", file=sys.stderr)
    return tasks


def _pytest_problem(tasks, config: TrialConfig):
    """Why the tasks of the `python` profile (verifiers that run pytest) cannot run here, naming
    how many need it and the fix, or None (before any trial starts, not as a failure mid-check)."""
    from jaxrl.envs.harbor import UnsupportedEnvironmentError
    from jaxrl.envs.harbor.python_runtime import find_python

    needs = [t for t in tasks if t.environment.profile == "python"]
    if not needs:
        return None
    try:
        find_python(config.sandbox.python)
    except UnsupportedEnvironmentError as e:
        return (f"{len(needs)} of the {len(tasks)} tasks (e.g. {needs[0].name}) use the `python` profile, whose "
                f"verifiers run pytest inside the sandbox; {e}. To check only the other tasks, pass --task NAME "
                "(python -m jaxrl.tasks list shows each task's profile)")
    return None


def cmd_check(args) -> int:
    tasks = _load(args)
    if args.task:
        unknown = [n for n in args.task if not any(n in (t.name, t.path.name) for t in tasks)]
        if unknown:  # every name must match: an unknown one was dropped silently when another matched
            print(f"error: no task named {', '.join(unknown)} in {args.path}. Fix: pass a name that "
                  f"`python -m jaxrl.tasks list {args.path}` prints", file=sys.stderr)
            return 2
        tasks = [t for t in tasks if t.name in args.task or t.path.name in args.task]
    config = _trial_config(args, keep="all" if args.trials_dir else "none")
    check_sandbox(config.sandbox)
    problem = _pytest_problem(tasks, config)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    n = args.concurrency or default_concurrency()
    print(f"checking {len(tasks)} task{'s' if len(tasks) != 1 else ''} from {args.path} ({n} trials at a time; "
          f"{_backend_line(tasks)})...",
          file=sys.stderr)
    t0 = time.monotonic()
    checks = check_tasks(tasks, config=config, concurrency=n, trials_dir=args.trials_dir)
    dt = time.monotonic() - t0
    print(format_check_table(checks, failures_only=not args.all))
    n_trials = sum((c.oracle is not None) + (c.empty is not None) for c in checks)
    print(f"({n_trials} trials in {dt:.1f} s)", file=sys.stderr)
    if args.json:
        from jaxrl.fileio import atomic_write_json

        atomic_write_json(args.json, [{"task": c.task_name, "passed": c.passed, "problems": c.problems,
                                       "oracle": c.oracle.to_row() if c.oracle else None,
                                       "stage": c.stage,
                                       "empty": c.empty.to_row() if c.empty else None} for c in checks])
    return 0 if all(c.passed for c in checks) else 1


def cmd_list(args) -> int:
    errors: list = []
    tasks = load_task_set(args.path, extract_dir=args.extract_dir, skip_invalid=True, errors=errors,
                          environment_backend=args.environment_backend)
    w = max([len("task")] + [len(t.name) for t in tasks])
    print(f"{'task':<{w}}  {'profile':<7}  {'agent s':>7}  {'verif s':>7}  {'mem MB':>6}  oracle  family")
    for t in tasks:
        a = "-" if t.config.agent_timeout_sec is None else f"{t.config.agent_timeout_sec:g}"
        print(f"{t.name:<{w}}  {t.environment.profile:<7}  {a:>7}  {t.config.verifier_timeout_sec:>7g}  "
              f"{t.config.memory_mb:>6}  {'yes' if t.has_oracle else 'no':<6}  {t.config.metadata.get('family', '')}")
    for src, msg in errors:
        print(f"INVALID {msg}")
    print(f"{len(tasks)} valid tasks, {len(errors)} invalid; {_backend_line(tasks)}", file=sys.stderr)
    return 0 if not errors else 1


def cmd_run_oracle(args) -> int:
    tasks = _load(args)
    if args.task:
        tasks = [t for t in tasks if t.name == args.task or t.path.name == args.task]
    if len(tasks) != 1:
        print(f"error: pick one task with --task (found {len(tasks)} matching in {args.path})", file=sys.stderr)
        return 2
    config = _trial_config(args, keep="all")
    check_sandbox(config.sandbox)
    import tempfile

    trial_dir = args.trials_dir or tempfile.mkdtemp(prefix="jaxrl-trial-")
    r = run_trial(tasks[0], empty_agent if args.empty else oracle_agent, config=config,
                  trial_dir=f"{trial_dir}/{tasks[0].path.name}")
    print(f"--- test-stdout.txt (tail) ---\n{r.test_output}")
    print(json.dumps(r.to_row(), indent=2))
    print(f"trial directory: {trial_dir}/{tasks[0].path.name}", file=sys.stderr)
    return 0 if r.reward == (0.0 if args.empty else 1.0) else 1


def output_path_problem(args) -> str | None:
    """One line naming the first output flag (--json, --trials-dir, --extract-dir) whose path
    cannot be written (`jaxrl.fileio`), with the fix; None when all can."""
    from jaxrl.fileio import output_dir_problem, output_file_problem

    for flag, attr, check, what in (("--json", "json", output_file_problem, "a JSON file path"),
                                    ("--trials-dir", "trials_dir", output_dir_problem, "a directory path"),
                                    ("--extract-dir", "extract_dir", output_dir_problem, "a directory path")):
        value = getattr(args, attr, None)
        problem = value and check(value)
        if problem:
            return f"{flag}: {problem}. Fix: pass {what} in a writable folder (it is created if missing)"
    return None


def main(argv=None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if args_in[:1] == ["funnel"]:  # its own options (jaxrl/envs/harbor/funnel.py)
        from jaxrl.envs.harbor import funnel

        try:
            return funnel.main(args_in[1:])
        except KeyboardInterrupt:
            print("interrupted: `python -m jaxrl.tasks funnel` stopped before it finished; nothing was reported",
                  file=sys.stderr)
            return 130
    p = ArgumentParser(prog="python -m jaxrl.tasks", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, path_default=True):
        sp.add_argument("path", nargs="?" if path_default else None, default=str(SHIPPED_TASKS_DIR),
                        help="task directory, folder of tasks, or DCAgent .parquet (default: the shipped set)")
        sp.add_argument("--skip-invalid", action="store_true", help="skip invalid tasks (reported) instead of failing")
        sp.add_argument("--extract-dir", default=None,
                        help="where a .parquet set is unpacked (default: <file>.parquet.tasks/ next to it)")
        sp.add_argument("--environment-backend", choices=("profile", "image", "auto"), default="profile",
                        help="profile: read Dockerfiles on host profiles (default); image: build them (buildah); "
                             "auto: profile when the Dockerfile loads as one, else image")

    def trial_opts(sp):
        sp.add_argument("--agent-timeout", type=float, default=None, help="agent budget, s (default: task.toml)")
        sp.add_argument("--verifier-timeout", type=float, default=None, help="verifier budget, s (default: task.toml)")
        sp.add_argument("--limits", choices=("auto", "cgroup", "rlimit"), default="auto",
                        help="how processes and memory are limited (default: cgroups when writable)")
        sp.add_argument("--host-uid", type=int, default=None,
                        help="as root: run sandboxes as this unprivileged host uid (needed for rlimits as root)")
        sp.add_argument("--trials-dir", default=None, help="keep the trial directories here")
        sp.add_argument("--base-image", action="append", metavar="NAME=LOCAL",
                        help="image backend: build FROM NAME on the local image LOCAL (repeatable; nothing is pulled)")
        sp.add_argument("--image-cache-dir", default=None, help="image backend: index, locks and build logs "
                        "(default: ~/.cache/jaxrl/images)")
        sp.add_argument("--image-cache-max-mb", type=int, default=20480,
                        help="image backend: MB of built images kept (least recently used removed above it)")
        sp.add_argument("--build-concurrency", type=int, default=1, help="image backend: builds at once")
        sp.add_argument("--image-builder", choices=("buildah", "podman"), default="buildah",
                        help="image backend: build with buildah or podman (neither runs a container runtime)")
        sp.add_argument("--pip-mirror", default=None, metavar="DIR",
                        help="a folder of wheels (pip download -d DIR ...) bound into every trial; pip and uv "
                             "install from it alone (verifiers that install pytest without network)")
        sp.add_argument("--tool-mirror", default=None, metavar="DIR",
                        help="a folder whose bin/ ends the verifier's PATH (launch/make_tool_mirror.sh DIR --uv VER: "
                             "uv for verifiers that download it from astral.sh)")
        sp.add_argument("--stop-agent-processes", action="store_true",
                        help="kill the agent's (oracle's) processes before the verifier runs (default: they keep "
                             "running through verification, as in Harbor)")
        sp.add_argument("--UNSAFE-no-sandbox", dest="UNSAFE_no_sandbox", action="store_true",
                        help="run task and agent commands directly on this host WITHOUT ISOLATION (disposable "
                             "machines only; one trial at a time)")

    sp = sub.add_parser("check", help="verifier sanity gate: oracle must get 1, the empty agent 0")
    common(sp)
    trial_opts(sp)
    sp.add_argument("--concurrency", type=int, default=None, help="trials at a time (default: CPU cores)")
    sp.add_argument("--task", action="append", help="only this task (repeatable)")
    sp.add_argument("--all", action="store_true", help="print every task, not only the failing ones")
    sp.add_argument("--json", default=None, help="also write the results to this JSON file")
    sp.set_defaults(fn=cmd_check)

    sp = sub.add_parser("list", help="list the tasks of a set (and the invalid ones with the reason)")
    common(sp)
    sp.set_defaults(fn=cmd_list)

    sp = sub.add_parser("run-oracle", help="run one task's oracle (or the empty agent) and show the verifier output")
    common(sp)
    trial_opts(sp)
    sp.add_argument("--task", default=None, help="the task name (or directory name)")
    sp.add_argument("--empty", action="store_true", help="run the empty agent instead of the oracle")
    sp.set_defaults(fn=cmd_run_oracle)

    sub.add_parser("funnel", help="how many tasks of task collections load, and why the others do not, by cause "
                                  "(python -m jaxrl.tasks funnel --help)")

    from jaxrl import cli

    problem = cli.no_overrides(sys.argv[1:] if argv is None else argv, "python -m jaxrl.tasks",
                               "its settings are its options, see --help")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "concurrency", None) is not None and args.concurrency < 1:
        p.error("--concurrency must be >= 1")
    problem = output_path_problem(args) or image_options_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except (HarborTaskError, SandboxError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the running trials were stopped and cleaned up on the way out
        print(f"interrupted: `python -m jaxrl.tasks {args.cmd}` stopped before it finished; nothing was reported",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
