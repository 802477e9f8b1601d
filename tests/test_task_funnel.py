"""The task-collection funnel (jaxrl/envs/harbor/funnel.py): counts per cause, worked out by hand."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harbor_helpers import write_task_dir
from jaxrl.envs.harbor.funnel import cause_of, find_tasks, load_stage, split_blockers, summarize

REPO = Path(__file__).resolve().parents[1]


def test_cause_of_each_kind_of_blocker():
    assert cause_of("line 2: `RUN mkdir -p /workspace`: /workspace is outside /app, the ...") == "RUN mkdir outside /app"
    assert cause_of("line 3: `COPY a /opt/a`: /opt/a is outside /app, the ...") == "COPY/ADD outside /app"
    assert cause_of("line 4: `RUN curl -sSL x | sh`: command `curl` (in `curl -sSL x`) is not ...") == \
        "download at build time (curl/wget/git)"
    assert cause_of("profile 'python': line 9: pip package 'pandas' cannot be imported by ...") == \
        "pip package the host lacks"
    assert cause_of("line 1: `FROM a AS b`: multi-stage builds are not supported") == "multi-stage build / COPY --from"
    assert cause_of("something new") == "other"


def test_split_blockers_of_a_refusal_with_several():
    msg = ("t/environment/Dockerfile: 3 problems for the local sandbox: (1) line 2: `RUN x`: command `x`; "
           "(2) line 3: `COPY a /b`: /b is outside /app; (3) no sandbox profile provides this environment: "
           "profile 'shell' has no Python; profile 'python': line 4: apt package 'ffmpeg' is unknown")
    assert split_blockers(msg) == ["line 2: `RUN x`: command `x`", "line 3: `COPY a /b`: /b is outside /app",
                                   "profile 'shell' has no Python", "profile 'python': line 4: apt package 'ffmpeg' is unknown"]
    assert split_blockers("t/environment/Dockerfile line 2: `RUN x`: why") == ["t/environment/Dockerfile line 2: `RUN x`: why"]


def test_funnel_of_a_small_collection(tmp_path):
    root = tmp_path / "set"
    write_task_dir(root, "ok")
    write_task_dir(root, "two", dockerfile="FROM ubuntu:24.04\nRUN mkdir -p /workspace\nCOPY a.txt /opt/a.txt\n",
                   files={"environment/a.txt": "a"})
    write_task_dir(root, "one", dockerfile="FROM ubuntu:24.04\nRUN mkdir -p /data && mkdir -p /srv\n")
    (root / "not-a-task").mkdir()
    loads = load_stage(find_tasks([root]))
    assert [Path(x.path).name for x in loads] == ["ok", "one", "two"]
    assert [x.loaded for x in loads] == [True, False, False]
    assert loads[1].causes == ["RUN mkdir outside /app", "RUN mkdir outside /app"]
    assert loads[2].causes == ["RUN mkdir outside /app", "COPY/ADD outside /app"]
    s = summarize(loads)
    assert s["tasks"] == 3 and s["loaded"] == 1
    assert s["causes"] == {"RUN mkdir outside /app": {"tasks": 2, "first": 2, "alone": 1},
                           "COPY/ADD outside /app": {"tasks": 1, "first": 0, "alone": 0}}
    out = subprocess.run([sys.executable, "-m", "jaxrl.tasks", "funnel", str(root), "--json", str(tmp_path / "f.json")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"{root}: 3 tasks, 1 load (33.3%), 2 refused"
    assert json.loads((tmp_path / "f.json").read_text())["summary"][str(root)] == s
    bad = subprocess.run([sys.executable, "-m", "jaxrl.tasks", "funnel", str(tmp_path / "nope")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Fix:" in bad.stderr, bad.stderr


def test_funnel_bad_inputs_are_one_line_each(tmp_path, capsys):
    """The fresh-user review: --json under /proc gave a traceback, an empty folder printed '0 tasks'
    with status 0, a missing folder was 'not a directory'."""
    root = tmp_path / "set"
    write_task_dir(root, "ok")
    (tmp_path / "empty").mkdir()
    from jaxrl import tasks as tasks_cli  # in process; test_funnel_of_a_small_collection runs the command line

    for args, start in ((["--json", "/proc/x.json", str(root)], "error: --json: /proc/x.json cannot be written: /proc "),
                        ([str(tmp_path / "empty")], f"error: no task found under {tmp_path / 'empty'}"),
                        ([str(tmp_path / "nope")], f"error: {tmp_path / 'nope'} does not exist. Fix:")):
        capsys.readouterr()
        code = tasks_cli.main(["funnel", *args])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(start) and len(err.splitlines()) == 1, err
        assert "Traceback" not in err


def test_output_paths_are_probed_for_real_writes():
    """os.access passes for root on /proc (and on read-only filesystems); a real probe does not."""
    from jaxrl.fileio import output_dir_problem, output_file_problem

    assert output_file_problem("/proc/x.json").startswith("/proc/x.json cannot be written: /proc is a directory "
                                                          "where no file can be created")
    assert output_dir_problem("/proc/run/sub").startswith("/proc/run/sub cannot be created: /proc is a directory")
