"""Applies the selection rule of the public-task measurement (docs/terminal_tasks.md, "Public task collections
on the image backend") to task collections, and summarises a `python -m jaxrl.tasks funnel --gate --json`
report over the selected tasks.

    python scripts/select_public_tasks.py DIR [DIR ...]                    # the selected tasks, one per line
    python scripts/select_public_tasks.py DIR [DIR ...] --report FUNNEL.json  # load / gate over the selection

The rule, checked on the files only (nothing is built or run here):
1. the task has solution/solve.sh;
2. every FROM / COPY --from image of environment/Dockerfile and tests/Dockerfile is one the stand-ins of
   launch/make_base_stand_ins.sh cover (STAND_INS);
3. no RUN step downloads from another host than Debian's mirror and PyPI (curl, wget, git, a fetch script,
   huggingface);
4. tests/test.sh downloads nothing (curl, wget, git, uvx, apt-get), or installs only with pip from PyPI and
   the image has pip (python3-pip installed, or a python:* base);
5. the task is not one of its repository's fixtures built to fail a check (a path part `fail` under
   `fixtures/`, or a directory named `fail-*` under `test-tasks/`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxrl.envs.harbor.dockerfile import rewrite_bases  # noqa: E402

STAND_INS = {"ubuntu:24.04", "python:3.11-slim", "python:3.12-slim", "ghcr.io/astral-sh/uv:0.8.15"}
_RUN_DOWNLOAD = re.compile(r"\b(curl|wget|git\s+clone|git\s+fetch|fetch_media|huggingface|hf_hub)\b")
_TEST_DOWNLOAD = re.compile(r"\b(curl|wget|git\s+clone|uvx|apt-get\s+(?:update|install))\b")
_PIP_INSTALL = re.compile(r"\bpip3?\s+install\b|-m\s+pip\s+install\b")


def _images(dockerfile: Path) -> set:
    """The external images (FROM and COPY --from; stages excluded) of a Dockerfile, by the image backend's own scan."""
    if not dockerfile.is_file():
        return set()
    return set(rewrite_bases(dockerfile.read_text(errors="replace"), {})[1])


def reasons(task: Path) -> list[str]:
    """The rule's points this task fails (empty: selected)."""
    why = []
    if not (task / "solution" / "solve.sh").is_file():
        why.append("1 no oracle")
    env_df, tests_df = task / "environment" / "Dockerfile", task / "tests" / "Dockerfile"
    images = _images(env_df) | _images(tests_df)
    if not env_df.is_file():
        why.append("2 no Dockerfile")
    elif images - STAND_INS:
        why.append(f"2 base images without a stand-in: {sorted(images - STAND_INS)}")
    runs = "\n".join(ln for df in (env_df, tests_df) if df.is_file()
                     for ln in df.read_text(errors="replace").splitlines() if not ln.lstrip().startswith("#"))
    if _RUN_DOWNLOAD.search(runs):
        why.append(f"3 build-time download ({_RUN_DOWNLOAD.search(runs).group(1)})")
    test = (task / "tests" / "test.sh").read_text(errors="replace") if (task / "tests" / "test.sh").is_file() else ""
    if _TEST_DOWNLOAD.search(test):
        why.append(f"4 verification-time download ({_TEST_DOWNLOAD.search(test).group(1)})")
    elif _PIP_INSTALL.search(test):
        text = env_df.read_text(errors="replace") if env_df.is_file() else ""
        if not (re.search(r"python3-pip", text) or any(i.startswith("python:") for i in _images(env_df))):
            why.append("4 verification-time pip install without pip in the image")
    parts = task.parts
    if ("fixtures" in parts and "fail" in parts) or ("test-tasks" in parts and task.name.startswith("fail-")):
        why.append("5 a fixture built to fail")
    return why


def find_tasks(roots) -> list[Path]:
    out = []
    for r in roots:
        out += sorted(p.parent for p in Path(r).rglob("task.toml"))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--report", help="a `jaxrl.tasks funnel --gate --json` file to summarise over the selection")
    p.add_argument("--why", action="store_true", help="also print why each left-out task is left out")
    a = p.parse_args()
    for d in a.dirs:
        if not Path(d).is_dir():
            print(f"error: {d} is not a folder. Fix: pass the folders of the task collections", file=sys.stderr)
            return 2
    tasks = find_tasks(a.dirs)
    if not tasks:
        print(f"error: no task (a directory with a task.toml) under {', '.join(a.dirs)}", file=sys.stderr)
        return 2
    selected = [t for t in tasks if not reasons(t)]
    if a.why:
        for t in tasks:
            if reasons(t):
                print(f"left out {t}: {'; '.join(reasons(t))}", file=sys.stderr)
    if not a.report:
        print("\n".join(str(t) for t in selected))
        print(f"{len(selected)} of {len(tasks)} tasks selected", file=sys.stderr)
        return 0
    try:
        rep = json.loads(Path(a.report).read_text())
        loaded = {Path(t["path"]).resolve() for t in rep["tasks"] if t["loaded"]}
        stage = {Path(r["task"]).resolve(): r for r in rep["stages"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --report {a.report}: not a `python -m jaxrl.tasks funnel --gate --json` report ({e}). Fix: "
              "write one with funnel ... --gate --json FILE", file=sys.stderr)
        return 2
    sel = [t.resolve() for t in selected]
    absent = [t for t in sel if t not in stage]
    if absent:
        print(f"error: --report {a.report} has no gate result for {len(absent)} of the {len(sel)} selected tasks "
              f"(e.g. {absent[0]}). Fix: run the funnel with --gate over the same folders", file=sys.stderr)
        return 2
    n_load = sum(t in loaded for t in sel)
    n_pass = sum(stage.get(t, {}).get("stage") == "passed" for t in sel)
    by_repo: dict = {}
    for t in sel:
        repo = next((d for d in a.dirs if str(t).startswith(str(Path(d).resolve()))), "?")
        by_repo.setdefault(repo, [0, 0])
        by_repo[repo][0] += 1
        by_repo[repo][1] += stage.get(t, {}).get("stage") == "passed"
    print(f"selected {len(sel)} of {len(tasks)} tasks; load {n_load} ({100 * n_load / max(len(sel), 1):.1f}%); "
          f"pass the gate {n_pass} ({100 * n_pass / max(len(sel), 1):.1f}%)")
    for repo, (n, k) in by_repo.items():
        print(f"  {repo}: {n} selected, {k} pass")
    for t in sel:
        r = stage.get(t)
        if r and r["stage"] != "passed":
            print(f"  failed at {r['stage']}: {t.name}: {r['cause']}: {r['problem'][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
