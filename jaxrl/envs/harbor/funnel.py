"""The funnel of a task collection: how many tasks load, build and pass the gate, and why the others do not.

    python -m jaxrl.tasks funnel PATH [PATH ...] [--json OUT]                       # load stage only
    python -m jaxrl.tasks funnel PATH ... --environment-backend image --base-image NAME=LOCAL ... --gate

Every directory under PATH holding a `task.toml` is one task. Each is loaded as `jaxrl.tasks check`
would load it (`task.load_task`, with `--environment-backend`); a refused task's message lists every
blocker (of its Dockerfile on the profile path, `profiles.resolve_environment`), and each blocker is
given one cause from `CAUSES` (the first pattern that matches). The report counts, per cause, the
tasks it blocks at all, the tasks where it is the first blocker, and the tasks it alone blocks (fix
that cause and they load). Without `--gate` nothing is built or run.

With `--gate`, the loaded tasks then go through `check_tasks`: the build stage (image backend: each
image built once; a failed build's cause from `BUILD_CAUSES`, matched on its message) and the gate
(oracle reward 1, empty agent 0; the cause of a failure from `runner.gate_cause`).
"""
from __future__ import annotations

import collections
import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

from jaxrl.errors import ArgumentParser

# (cause, pattern on one blocker's text); the first match names the blocker's cause.
CAUSES: tuple[tuple[str, str], ...] = (
    ("multi-stage build / COPY --from", r"multi-stage|flag --from"),
    ("RUN mkdir outside /app", r"`RUN [^`]*`: /\S* is outside /app"),
    ("WORKDIR outside /app", r"`WORKDIR [^`]*`: /\S* is outside /app"),
    ("COPY/ADD outside /app", r"`(COPY|ADD) [^`]*`: /\S* is outside /app"),
    ("download at build time (curl/wget/git)", r"command `(curl|wget|git)`"),
    ("file written by a shell command (echo/printf/cat/sed/tee/chmod/cp/mv/ln/touch)",
     r"command `(echo|printf|cat|sed|tee|chmod|chown|cp|mv|ln|touch|rm|tar|unzip)`"),
    ("language tool at build time (python/R/npm/gem/cargo/go/make)",
     r"command `(python\S*|R|Rscript|npm|npx|gem|cargo|go|make|cmake|gcc|g\+\+|node|uv|pip\S*|conda)`"),
    ("apt repository setup", r"command `(add-apt-repository|apt-key|gpg|dpkg)`|apt subcommand"),
    ("other RUN command", r"command `[^`]+`"),
    ("heredoc in RUN", r"heredocs"),
    ("pip package the host lacks", r"pip package '[^']+' cannot be imported"),
    ("pip -r / --index-url / -e", r"pip option"),
    ("pip package not from PyPI", r"pip package `"),
    ("apt package the host lacks", r"apt package '[^']+' is (not installed on this host|unknown)"),
    ("no profile with Python", r"has no Python"),
    ("base image without a profile", r"base image .* has no sandbox profile"),
    ("USER other than root", r"one unprivileged user"),
    ("SHELL other than sh/bash", r"SHELL"),
    ("COPY source missing / outside the context", r"does not exist in the build context|outside the build context"),
    ("remote ADD / archive ADD", r"remote source|ADD of archive"),
    ("no Dockerfile / docker-compose", r"no Dockerfile|docker-compose"),
    ("task.toml field refused", r"task\.toml"),
)
_PATTERNS = tuple((c, re.compile(p)) for c, p in CAUSES)
OTHER = "other"

# (cause, pattern on an `ImageBuildError` message, which ends with the build log's last error line).
BUILD_CAUSES: tuple[tuple[str, str], ...] = (
    ("base image with no local image", r"not a local image|no local image of that name"),
    ("build timeout", r"ran longer than build_timeout_sec"),
    ("download from a host not reachable here",
     r"(?i)could not resolve|name or service not known|temporary failure in name resolution|network is unreachable|"
     r"failed to establish|connection refused|huggingface|github\.com|astral\.sh"),
    ("TLS certificate", r"(?i)certificate|ssl|tls"),
    ("apt package missing from Debian", r"Unable to locate package|has no installation candidate"),
    ("pip package or version not available", r"(?i)no matching distribution|could not find a version|"
                                            r"no solution found|because there is no version"),
    ("COPY/ADD source missing", r"(?i)(COPY|ADD)[^:]*:.*(no such file|not found|does not exist)"),
    ("builder missing", r"(?i)buildah is not installed|builder .* not available"),
)
_BUILD_PATTERNS = tuple((c, re.compile(p)) for c, p in BUILD_CAUSES)


def build_cause_of(message: str) -> str:
    """The `BUILD_CAUSES` name of a failed build's message, or "build step failed"."""
    return next((c for c, p in _BUILD_PATTERNS if p.search(message)), "build step failed")


def cause_of(blocker: str) -> str:
    """The `CAUSES` name of one blocker's text ("line N: `instr`: why"), or "other"."""
    return next((c for c, p in _PATTERNS if p.search(blocker)), OTHER)


def split_blockers(message: str) -> list[str]:
    """The blockers in a refusal message: "(1) ...; (2) ..." items, or the message itself."""
    items = re.split(r"(?:^|; )\(\d+\) ", message.split(" problems for the local sandbox: ", 1)[-1])
    items = [i for i in items if i.strip()]
    if " problems for the local sandbox: " not in message:
        return [message]
    # a profile problem lists several "profile 'x': line N: ..." parts joined by "; ": one item each
    out = []
    for it in items:
        if it.startswith("no sandbox profile provides this environment: "):
            out.extend(x for x in it.split(": ", 1)[1].split("; ") if x)
        else:
            out.append(it)
    return out


@dataclasses.dataclass
class TaskLoad:
    """One task's load: its path, whether it loaded, and its blockers with their causes."""

    path: str
    loaded: bool
    blockers: list[str]
    causes: list[str]


def find_tasks(roots: Iterable[str | os.PathLike]) -> list[Path]:
    """Every directory under `roots` that holds a task.toml, sorted (a task inside a task is not searched)."""
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if "task.toml" in filenames:
                found.append(Path(dirpath))
                dirnames[:] = []
            dirnames.sort()
    return sorted(found)


def load_stage(tasks: Sequence[Path], environment_backend: str = "profile", loaded: Optional[list] = None
               ) -> list[TaskLoad]:
    """Loads every task (`load_task`) and records why each refused one was refused; the loaded
    `HarborTask`s are appended to `loaded` when given."""
    from jaxrl.envs.harbor.errors import HarborTaskError
    from jaxrl.envs.harbor.task import load_task

    out = []
    for t in tasks:
        try:
            task = load_task(t, environment_backend=environment_backend)
            if loaded is not None:
                loaded.append(task)
            out.append(TaskLoad(str(t), True, [], []))
        except (HarborTaskError, OSError, ValueError) as e:
            msg = str(e)
            if msg.startswith(str(t.resolve())):
                msg = msg[len(str(t.resolve())):].lstrip(": ")
            blockers = split_blockers(msg)
            out.append(TaskLoad(str(t), False, blockers, [cause_of(b) for b in blockers]))
    return out


def summarize(loads: Sequence[TaskLoad]) -> dict:
    """Counts per cause: tasks blocked by it at all, as their first blocker, and by it alone."""
    any_, first, alone = collections.Counter(), collections.Counter(), collections.Counter()
    for ld in loads:
        if ld.loaded:
            continue
        kinds = list(dict.fromkeys(ld.causes))
        any_.update(kinds)
        first[ld.causes[0]] += 1
        if len(kinds) == 1:
            alone[kinds[0]] += 1
    return {"tasks": len(loads), "loaded": sum(ld.loaded for ld in loads),
            "causes": {c: {"tasks": any_[c], "first": first[c], "alone": alone[c]}
                       for c, _ in sorted(any_.items(), key=lambda kv: (-kv[1], kv[0]))}}


def gate_stage(tasks: Sequence, config, concurrency: Optional[int] = None,
               trials_dir: Optional[str] = None) -> list[dict]:
    """`check_tasks` over loaded tasks; one row per task: its stage reached ("build", "gate" or
    "passed") and the cause of a failure (`build_cause_of` / `runner.gate_cause`) with the problem text."""
    from jaxrl.envs.harbor.runner import check_tasks, gate_cause

    rows = []
    for t, c in zip(tasks, check_tasks(tasks, config=config, concurrency=concurrency, trials_dir=trials_dir)):
        if c.passed:
            rows.append({"task": str(t.path), "stage": "passed", "cause": "", "problem": ""})
        elif c.stage == "build":
            rows.append({"task": str(t.path), "stage": "build", "cause": build_cause_of(c.problems[0]),
                         "problem": c.problems[0]})
        else:
            rows.append({"task": str(t.path), "stage": "gate", "cause": gate_cause(c), "problem": "; ".join(c.problems)})
    return rows


def format_stages(name: str, loads: Sequence[TaskLoad], rows: Sequence[dict]) -> str:
    """The build and gate stages of the funnel as a plain-text table (counts per cause)."""
    n_load = sum(ld.loaded for ld in loads)
    built = [r for r in rows if r["stage"] != "build"]
    passed = [r for r in rows if r["stage"] == "passed"]
    lines = [f"{name}: {len(loads)} tasks, {n_load} load, {len(built)} build, {len(passed)} pass the gate "
             f"({100 * len(passed) / max(len(loads), 1):.1f}% of all, {100 * len(passed) / max(n_load, 1):.1f}% "
             "of those that load)"]
    for stage in ("build", "gate"):
        counts = collections.Counter(r["cause"] for r in rows if r["stage"] == stage)
        for cause, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {stage} failed: {cause:<44} {k:>5}")
    return "\n".join(lines)


def format_summary(name: str, s: dict) -> str:
    """The funnel as a plain-text table."""
    n, ok = s["tasks"], s["loaded"]
    w = max([len("cause")] + [len(c) for c in s["causes"]])
    lines = [f"{name}: {n} tasks, {ok} load ({100 * ok / max(n, 1):.1f}%), {n - ok} refused"]
    if s["causes"]:
        lines.append(f"  {'cause':<{w}} {'tasks':>6} {'first':>6} {'alone':>6}")
    for c, v in s["causes"].items():
        lines.append(f"  {c:<{w}} {v['tasks']:>6} {v['first']:>6} {v['alone']:>6}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = ArgumentParser(prog="python -m jaxrl.tasks funnel", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="folders searched for task directories (each a collection)")
    p.add_argument("--json", help="write every task's load, blockers and causes here")
    p.add_argument("--environment-backend", choices=("profile", "image", "auto"), default="profile",
                   help="how tasks are loaded, as `check` (default profile)")
    p.add_argument("--gate", action="store_true", help="also build the loaded tasks and run the gate (oracle 1, "
                   "empty agent 0): the build and gate stages")
    p.add_argument("--concurrency", type=int, default=None, help="--gate: trials at a time (default: CPU cores)")
    p.add_argument("--trials-dir", default=None, help="--gate: keep the trial directories here")
    p.add_argument("--base-image", action="append", metavar="NAME=LOCAL", help="as `check`")
    p.add_argument("--image-cache-dir", default=None, help="as `check`")
    p.add_argument("--image-cache-max-mb", type=int, default=20480, help="as `check`")
    p.add_argument("--build-concurrency", type=int, default=1, help="as `check`")
    p.add_argument("--image-builder", choices=("buildah", "podman"), default="buildah", help="as `check`")
    p.add_argument("--pip-mirror", default=None, metavar="DIR", help="as `check`")
    p.add_argument("--tool-mirror", default=None, metavar="DIR", help="as `check`")
    args = p.parse_args(argv)
    from jaxrl.envs.harbor.image_flags import image_options_problem

    problem = image_options_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.concurrency is not None and args.concurrency < 1:
        print(f"error: --concurrency {args.concurrency}: must be at least 1. Fix: e.g. 2", file=sys.stderr)
        return 2
    for x in args.paths:
        if not os.path.isdir(x):
            what = "is not a directory" if os.path.exists(x) else "does not exist"
            print(f"error: {x} {what}. Fix: pass folders that hold task directories (each with a task.toml)",
                  file=sys.stderr)
            return 2
        if not find_tasks([x]):
            print(f"error: no task found under {x} (a task is a directory with a task.toml). Fix: pass a folder "
                  "of Harbor tasks", file=sys.stderr)
            return 2
    if args.json:
        from jaxrl.fileio import output_file_problem

        problem = output_file_problem(args.json)
        if problem:
            print(f"error: --json: {problem}. Fix: pass a JSON file path in a writable folder", file=sys.stderr)
            return 2
    config = None
    if args.gate:
        from jaxrl.envs.harbor import SandboxConfig, TrialConfig, check_sandbox
        from jaxrl.envs.harbor.image_flags import image_config

        config = TrialConfig(keep="all" if args.trials_dir else "none", images=image_config(args),
                             sandbox=SandboxConfig(pip_mirror=args.pip_mirror, tool_mirror=args.tool_mirror))
        check_sandbox(config.sandbox)
    report, every, stage_rows = {}, [], []
    for root in args.paths:
        tasks: list = []
        loads = load_stage(find_tasks([root]), args.environment_backend, tasks)
        s = summarize(loads)
        report[root] = s
        every.extend(loads)
        print(format_summary(root, s))
        if config is not None:
            rows = gate_stage(tasks, config, args.concurrency, args.trials_dir)
            stage_rows.extend(rows)
            s["stages"] = {"build": sum(r["stage"] != "build" for r in rows),
                           "passed": sum(r["stage"] == "passed" for r in rows)}
            print(format_stages(root, loads, rows))
    if len(args.paths) > 1:
        print(format_summary("all", summarize(every)))
        if config is not None:
            print(format_stages("all", every, stage_rows))
    if not all(x.loaded for x in every) and args.environment_backend == "profile":
        print("(counts for the profile path; tasks it refuses can be built from their Dockerfile: "
              "python -m jaxrl.tasks check PATH --environment-backend auto, docs/terminal_tasks.md)")
    if args.json:
        from jaxrl.fileio import atomic_write_json

        atomic_write_json(args.json, {"summary": report, "tasks": [dataclasses.asdict(x) for x in every],
                                      "stages": stage_rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
