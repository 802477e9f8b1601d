"""Harbor task sets without running them: task.toml, validation, Dockerfile profiles, archives, Parquet,
the task families and the shipped set."""
from __future__ import annotations

import filecmp
import io
import os
import tarfile
import textwrap
from pathlib import Path

import pytest

from harbor_helpers import PY_DOCKERFILE, write_task_dir
from jaxrl.envs.harbor import (FAMILIES, SHIPPED_TASKS_DIR, HarborTaskError, UnsupportedEnvironmentError,
                               extract_parquet, load_task, load_task_set, load_transcript, make_task,
                               pack_task, parse_task_toml, resolve_environment, safe_extract_tar, write_parquet)
from jaxrl.envs.harbor import profiles as profiles_mod
from jaxrl.envs.harbor.profiles import SANDBOX_PATH, Profile, register_profile

# ------------------------------------------------------------------------------------------------
# task.toml


def test_task_toml_new_schema():
    c = parse_task_toml(textwrap.dedent("""\
        schema_version = "1.1"
        [task]
        name = "org/my-task"
        [metadata]
        difficulty = "easy"
        [agent]
        timeout_sec = 900.0
        [verifier]
        timeout_sec = 120
        env = { A = "1", B = 2 }
        [solution]
        env = { S = "x" }
        [environment]
        cpus = 2
        memory_mb = 4096
        storage_mb = 2048
        allow_internet = false
        future_key = "ignored"
        """))
    assert (c.schema_version, c.name, c.agent_timeout_sec, c.verifier_timeout_sec) == ("1.1", "org/my-task", 900.0, 120.0)
    assert c.verifier_env == {"A": "1", "B": "2"} and c.solution_env == {"S": "x"}
    assert (c.cpus, c.memory_mb, c.storage_mb, c.allow_internet) == (2.0, 4096, 2048, False)
    assert c.metadata == {"difficulty": "easy"}


def test_task_toml_old_schema_and_defaults():
    c = parse_task_toml('version = "1.0"\n[environment]\nmemory = "2G"\nstorage = "512M"\n')
    assert c.schema_version == "1.0" and c.memory_mb == 2048 and c.storage_mb == 512
    d = parse_task_toml("")  # Harbor's defaults
    assert (d.agent_timeout_sec, d.verifier_timeout_sec, d.cpus, d.memory_mb, d.storage_mb, d.allow_internet) == \
        (None, 600.0, 1.0, 2048, 10240, True)  # Harbor 0.26: no agent timeout unless given
    assert parse_task_toml("[environment]\nmemory = \"1.5g\"\n").memory_mb == 1536


@pytest.mark.parametrize("text,match", [
    ("[agent\n", "not valid TOML"),
    ("[agent]\ntimeout_sec = -1\n", r"\[agent\].*timeout_sec.*positive"),
    ("[verifier]\ntimeout_sec = \"long\"\n", r"\[verifier\].*timeout_sec"),
    ("[environment]\nallow_internet = \"no\"\n", "allow_internet"),
    ("[environment]\ngpus = 1\n", "GPU tasks are not supported"),
    ("[environment]\nmemory = \"lots\"\n", "memory.*2G"),
    ("[verifier]\nenv = { A = [1] }\n", "env"),
    ("agent = 3\n", r"\[agent\].*table"),
])
def test_task_toml_errors_name_the_field(text, match):
    with pytest.raises(HarborTaskError, match=match):
        parse_task_toml(text, "x/task.toml")


# ------------------------------------------------------------------------------------------------
# task directories


def test_load_task_and_missing_pieces(tmp_path):
    d = write_task_dir(tmp_path, "ok")
    t = load_task(d)
    assert t.name == "test/ok" and t.instruction.startswith("Write done") and t.has_oracle
    assert t.environment.profile == "shell" and t.environment.workdir == "/app"
    for piece in ("tests/test.sh", "instruction.md", "task.toml"):
        d = write_task_dir(tmp_path, f"no-{piece.replace('/', '_')}")
        os.remove(d / piece)
        with pytest.raises(HarborTaskError, match=f"{d}.*missing {piece}"):
            load_task(d)
    d = write_task_dir(tmp_path, "no-env")
    (d / "environment" / "Dockerfile").unlink()
    (d / "environment").rmdir()
    with pytest.raises(HarborTaskError, match="missing environment"):
        load_task(d)
    d = write_task_dir(tmp_path, "bad-solution")
    (d / "solution" / "solve.sh").unlink()
    with pytest.raises(HarborTaskError, match="solution/ but no solution/solve.sh"):
        load_task(d)
    d = write_task_dir(tmp_path, "empty-instr", instruction="  ")
    with pytest.raises(HarborTaskError, match="instruction.md is empty"):
        load_task(d)
    d = write_task_dir(tmp_path, "escaping-link")
    os.symlink("/etc/passwd", d / "tests" / "passwd")
    with pytest.raises(HarborTaskError, match="symlink leaving the task"):
        load_task(d)


def test_load_task_set_folder(tmp_path):
    write_task_dir(tmp_path / "set" / "group-b", "b")
    write_task_dir(tmp_path / "set", "a")
    tasks = load_task_set(tmp_path / "set")
    assert [t.name for t in tasks] == ["test/a", "test/b"]
    assert load_task_set(tmp_path / "set" / "a")[0].name == "test/a"  # one task directory
    bad = write_task_dir(tmp_path / "set", "c")
    os.remove(bad / "tests" / "test.sh")
    with pytest.raises(HarborTaskError, match="missing tests/test.sh"):
        load_task_set(tmp_path / "set")
    errors = []
    assert len(load_task_set(tmp_path / "set", skip_invalid=True, errors=errors)) == 2
    assert len(errors) == 1 and "c" in errors[0][0]
    dup = write_task_dir(tmp_path / "set2", "x")
    write_task_dir(tmp_path / "set2", "y", toml=(dup / "task.toml").read_text())
    with pytest.raises(HarborTaskError, match="two tasks are named 'test/x'"):
        load_task_set(tmp_path / "set2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarborTaskError, match="no task found"):
        load_task_set(tmp_path / "empty")
    old = tmp_path / "oldtb" / "hello"
    old.mkdir(parents=True)
    (old / "task.yaml").write_text("instruction: say hello\n")
    (old / "run-tests.sh").write_text("#!/bin/sh\n")
    with pytest.raises(HarborTaskError, match=r"hello: a task in the older terminal-bench format \(task.yaml"):
        load_task_set(tmp_path / "oldtb")
    with pytest.raises(FileNotFoundError, match=r"task set '.*nope' does not exist. Fix: pass a Harbor task "
                                                r"directory, a folder of tasks or a DCAgent .parquet file$"):
        load_task_set(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------
# Dockerfiles -> profiles


def _env(tmp_path, dockerfile, files=None, image=None):
    d = tmp_path / f"env{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    if dockerfile is not None:
        (d / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return resolve_environment(d, image, where=str(d))


def test_dcagent_python_dockerfile_maps_to_the_python_profile(tmp_path):
    spec = _env(tmp_path, textwrap.dedent("""\
        # syntax=docker/dockerfile:1
        FROM ubuntu:24.04
        ENV DEBIAN_FRONTEND=noninteractive
        RUN apt-get update && \\
            apt-get install -y --no-install-recommends python3 python3-pip python3-venv bsdutils \\
            && rm -rf /var/lib/apt/lists/*
        RUN pip install --no-cache-dir --break-system-packages pytest==8.3.3
        WORKDIR /app
        ENV PATH="/root/.local/bin:$PATH" GREETING="hi there"
        CMD ["bash"]
        """))
    assert spec.profile == "python" and spec.workdir == "/app" and spec.base_image == "ubuntu:24.04"
    env = dict(spec.env)
    assert env["PATH"] == "/root/.local/bin:" + SANDBOX_PATH and env["GREETING"] == "hi there"
    assert any("CMD" in n for n in spec.notes)
    assert _env(tmp_path, "FROM debian:bookworm\nRUN apt-get install -y git curl\nWORKDIR /app\n").profile == "shell"
    assert _env(tmp_path, None, image="ubuntu:22.04").profile == "shell"


def test_copy_into_app(tmp_path):
    spec = _env(tmp_path, "FROM ubuntu:24.04\nWORKDIR /app\nCOPY data.txt ./\nCOPY --chmod=755 run.sh /app/bin/run.sh\n"
                          "COPY docs /app/docs\nCOPY . /app/all/\n",
                files={"data.txt": "d", "run.sh": "r", "docs/a.md": "a"})
    copies = [(os.path.basename(s), d, m) for s, d, m in spec.copies]
    assert ("data.txt", "/app/data.txt", None) in copies and ("run.sh", "/app/bin/run.sh", 0o755) in copies
    assert ("docs", "/app/docs", None) in copies
    assert ("Dockerfile", "/app/all/Dockerfile", None) not in copies and ("docs", "/app/all/docs", None) in copies


@pytest.mark.parametrize("dockerfile,match", [
    ("FROM ubuntu:24.04\nRUN curl -sSL https://x | sh\n", "line 2.*RUN curl.*command `curl`"),
    ("FROM ubuntu:24.04\nRUN apt-get install -y frobnicator\n", "line 2.*apt package 'frobnicator' is unknown"),
    ("FROM ubuntu:24.04\nRUN pip install no-such-package-jaxrl-test\n", "pip package 'no-such-package-jaxrl-test'"),
    ("FROM ubuntu:24.04\nRUN pip install -r requirements.txt\n", "pip option -r"),
    ("FROM ubuntu:24.04\nUSER nobody\n", "line 2.*USER nobody.*one unprivileged user"),
    ("FROM ubuntu:24.04\nSHELL [\"/bin/zsh\", \"-c\"]\n", "the SHELL instruction is not supported"),
    ("FROM ubuntu:24.04 AS b\nFROM ubuntu:24.04\n", "line 2.*multi-stage"),
    ("FROM alpine:3.19\n", "base image 'alpine:3.19' has no sandbox profile"),
    ("FROM ubuntu:24.04\nWORKDIR /workspace\n", "line 2.*/workspace is outside /app"),
    ("FROM ubuntu:24.04\nCOPY --from=builder /x /app/x\n", "flag --from"),
    ("FROM ubuntu:24.04\nADD https://example.com/x /app/x\n", "remote source"),
    ("FROM ubuntu:24.04\nCOPY missing.txt /app/\n", "missing.txt does not exist"),
    ("FROM ubuntu:24.04\nCOPY ../secret /app/\n", "outside the build context"),
    ("FROM ubuntu:24.04\nCOPY a.txt /etc/a.txt\n", "/etc/a.txt is outside /app"),
    ("FROM ubuntu:24.04\nRUN <<EOF\necho hi\nEOF\n", "heredocs"),
    ("RUN true\n", "before FROM"),
])
def test_unsupported_dockerfile_instructions_are_refused(tmp_path, dockerfile, match):
    (tmp_path / "secret").write_text("s")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a.txt").write_text("a")
    (ctx / "Dockerfile").write_text(dockerfile)
    with pytest.raises(UnsupportedEnvironmentError, match=match):
        resolve_environment(ctx, where="task/environment")


def test_a_refused_dockerfile_lists_every_blocker_at_once(tmp_path):
    """Issue 28: only the first blocker was named, so a user fixed one line and met the next. Every
    instruction and every command of a RUN chain is read; the package check runs too."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a.txt").write_text("a")
    (ctx / "Dockerfile").write_text(
        "FROM ubuntu:24.04\n"
        "RUN mkdir -p /workspace\n"                       # 2: outside /app
        "COPY a.txt /etc/a.txt\n"                          # 3: outside /app
        "RUN curl -sSL https://x | sh && mkdir /data\n"    # 4: two commands, both refused
        "WORKDIR /app\n"                                   # fine
        "RUN apt-get install -y frobnicator\n")            # 6: unknown package (profile check)
    with pytest.raises(UnsupportedEnvironmentError) as e:
        resolve_environment(ctx, where="task/environment")
    msg = str(e.value)
    assert msg.startswith("task/environment/Dockerfile: 5 problems for the local sandbox: (1) line 2:"), msg
    expected = ["(1) line 2: `RUN mkdir -p /workspace`: /workspace is outside /app",
                "(2) line 3: `COPY a.txt /etc/a.txt`: /etc/a.txt is outside /app",
                "(3) line 4: `RUN curl", "command `curl`",
                "(4) line 4: `RUN curl", "/data is outside /app",
                "(5) no sandbox profile provides this environment:", "line 6: apt package 'frobnicator' is unknown"]
    pos = [msg.find(x) for x in expected]
    assert -1 not in pos and pos == sorted(pos), (pos, msg)
    assert "\n" not in msg  # one line


def test_blockers_before_a_missing_from_are_listed_with_it(tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("RUN true\nENV A=1\n")
    with pytest.raises(UnsupportedEnvironmentError,
                       match=r"3 problems .*\(1\) line 1: `RUN true`: instruction before FROM; \(2\) line 2: "
                             r"`ENV A=1`: instruction before FROM; \(3\) no FROM instruction$"):
        resolve_environment(ctx, where="t/environment")


def test_no_dockerfile_and_compose_are_refused(tmp_path):
    with pytest.raises(UnsupportedEnvironmentError, match="no Dockerfile"):
        _env(tmp_path, None)
    with pytest.raises(UnsupportedEnvironmentError, match="docker-compose"):
        _env(tmp_path, None, files={"docker-compose.yaml": "services: {}"})


def test_pip_packages_the_sandbox_python_can_import_are_accepted(tmp_path):
    spec = _env(tmp_path, "FROM python:3.11-slim\nRUN pip install numpy 'pytest>=8'\nWORKDIR /app\n")
    assert spec.profile == "python"


def test_register_profile(tmp_path, monkeypatch):
    monkeypatch.setattr(profiles_mod, "_PROFILES", list(profiles_mod._PROFILES))
    with pytest.raises(UnsupportedEnvironmentError):
        _env(tmp_path, "FROM alpine:3.19\nWORKDIR /app\n")
    register_profile(Profile("alpine-like", "host /usr standing in for alpine", base_images=("alpine:*",)))
    assert _env(tmp_path, "FROM alpine:3.19\nWORKDIR /app\n").profile == "alpine-like"


# ------------------------------------------------------------------------------------------------
# archives


def _tar(members) -> bytes:
    """members: (name, kind, payload) with kind file|dir|sym|hard|chr."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
                continue
            ti.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                       "chr": tarfile.CHRTYPE}[kind]
            if kind in ("sym", "hard"):
                ti.linkname = payload
            tf.addfile(ti)
    return buf.getvalue()


@pytest.mark.parametrize("members,match", [
    ([("/etc/cron.d/x", "file", b"x")], "absolute path"),
    ([("a/../../x", "file", b"x")], "contains '..'"),
    ([("l", "sym", "/etc/passwd")], "absolute"),
    ([("d/l", "sym", "../../outside")], "points outside the task"),
    ([("d/l", "sym", ".."), ("d/l/s", "sym", "../x")], "symlink"),  # writing through a symlinked directory
    ([("d/l", "sym", "."), ("d/l/f", "file", b"x")], "symlink"),
    ([("h", "hard", "/etc/passwd")], "absolute path"),
    ([("h", "hard", "later.txt"), ("later.txt", "file", b"x")], "hard link"),
    ([("dev", "chr", "")], "device"),
    ([("a.txt", "file", b"1"), ("a.txt", "file", b"2")], "appears twice"),
    ([("big", "file", b"\0" * (3 << 20))], "exceeds the cap"),
])
def test_unsafe_archives_are_refused(tmp_path, members, match):
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(HarborTaskError, match=match):
        safe_extract_tar(_tar(members), dest, max_bytes=2 << 20)
    outside = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert outside == []  # nothing was written next to the destination


def test_archive_caps_and_allowed_links(tmp_path):
    with pytest.raises(HarborTaskError, match="more than 3 members"):
        safe_extract_tar(_tar([(f"f{i}", "file", b"x") for i in range(5)]), tmp_path, max_members=3)
    d = tmp_path / "ok"
    d.mkdir()
    safe_extract_tar(_tar([("a/f.txt", "file", b"hi"), ("a/l", "sym", "f.txt"), ("h.txt", "hard", "a/f.txt")]), d)
    assert (d / "a" / "l").read_text() == "hi" and os.path.islink(d / "a" / "l")
    assert (d / "h.txt").read_text() == "hi" and os.stat(d / "h.txt").st_nlink == 1  # copied, not linked
    with pytest.raises(HarborTaskError, match="not a readable tar"):
        safe_extract_tar(b"not a tar", tmp_path)


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes(), os.stat(p).st_mode & 0o111 != 0)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".jaxrl-extracted"}


def test_dcagent_parquet_round_trip(tmp_path):
    """Shipped tasks -> Parquet (path, task_binary) -> unpacked -> the same files, names and configs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = load_task_set(SHIPPED_TASKS_DIR)
    picked = [t for t in src if t.name.endswith(("write-file-000", "py-kata-gcd", "shell-find-000", "shell-sum-001"))]
    assert len(picked) == 4
    pq_path = tmp_path / "set.parquet"
    write_parquet([t.path for t in picked], pq_path, names=[f"tasks/{t.path.name}" for t in picked])
    table = pq.read_table(pq_path)
    assert table.column_names == ["path", "task_binary"] and table.schema.field("task_binary").type == pa.binary()
    loaded = load_task_set(pq_path, extract_dir=tmp_path / "x")
    assert [t.name for t in loaded] == [t.name for t in picked]
    for a, b in zip(picked, loaded):
        assert _tree(a.path) == _tree(b.path)
        assert (a.instruction, a.config, a.environment.profile) == (b.instruction, b.config, b.environment.profile)
        assert "set.parquet:row" in b.source
    # a second load reuses the unpacked directories (same bytes), a changed row is unpacked again
    mtime = (tmp_path / "x" / picked[0].path.name / "instruction.md").stat().st_mtime_ns
    load_task_set(pq_path, extract_dir=tmp_path / "x")
    assert (tmp_path / "x" / picked[0].path.name / "instruction.md").stat().st_mtime_ns == mtime
    # DCAgent archives may wrap the task in one top-level directory
    blob = _tar([("mytask/instruction.md", "file", b"Do it.\n"),
                 ("mytask/task.toml", "file", b'version = "1.0"\n'),
                 ("mytask/environment/Dockerfile", "file", PY_DOCKERFILE.encode()),
                 ("mytask/tests/test.sh", "file", b"#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")])
    pq.write_table(pa.table({"path": ["a/mytask"], "task_binary": [blob]}), tmp_path / "wrapped.parquet")
    (t,) = load_task_set(tmp_path / "wrapped.parquet")
    assert t.name == "mytask" and t.instruction == "Do it.\n" and t.environment.profile == "python"


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_parquet_extraction_follows_the_umask(tmp_path, umask):
    """Issue 9 §7: unpacked task directories get the umask's mode like every other file jaxrl
    writes. Each task directory is renamed into place from a `tempfile.mkdtemp` directory, which
    kept its 0700 whatever the umask; a hard-link copy got 0644 whatever the umask."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, mode, data in [("instruction.md", 0o644, b"Do it.\n"), ("tests/test.sh", 0o755, b"#!/bin/sh\n"),
                                 ("environment/Dockerfile", 0o600, PY_DOCKERFILE.encode())]:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), mode
            tf.addfile(ti, io.BytesIO(data))
        ti = tarfile.TarInfo("copy.md")
        ti.type, ti.linkname, ti.mode = tarfile.LNKTYPE, "instruction.md", 0o644
        tf.addfile(ti)
    pq_path = tmp_path / "set.parquet"
    pq.write_table(pa.table({"path": ["tasks/one"], "task_binary": [buf.getvalue()]}), pq_path)
    old = os.umask(umask)
    try:
        extract_parquet(pq_path, extract_dir=tmp_path / "x" / "y")
    finally:
        os.umask(old)
    # Expected by hand: directories and executables 0755, other files 0644, minus the umask.
    want_dir, want_exe, want_file = 0o755 & ~umask, 0o755 & ~umask, 0o644 & ~umask
    task = tmp_path / "x" / "y" / "one"
    modes = {str(p.relative_to(tmp_path / "x")): oct(os.stat(p).st_mode & 0o777)
             for p in [tmp_path / "x" / "y", *sorted(task.parent.rglob("*"))]}
    assert modes == {"y": oct(want_dir), "y/one": oct(want_dir), "y/one/.jaxrl-extracted": oct(want_file),
                     "y/one/instruction.md": oct(want_file), "y/one/copy.md": oct(want_file),
                     "y/one/tests": oct(want_dir), "y/one/tests/test.sh": oct(want_exe),
                     "y/one/environment": oct(want_dir), "y/one/environment/Dockerfile": oct(want_file)}


def test_parquet_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["a"]}), tmp_path / "nocol.parquet")
    with pytest.raises(HarborTaskError, match="needs the columns 'path' and 'task_binary'"):
        load_task_set(tmp_path / "nocol.parquet")
    pq.write_table(pa.table({"path": ["a"], "task_binary": pa.array([None], pa.binary())}), tmp_path / "null.parquet")
    with pytest.raises(HarborTaskError, match="row 0.*task_binary"):
        extract_parquet(tmp_path / "null.parquet")
    pq.write_table(pa.table({"path": ["a"], "task_binary": [_tar([("x.txt", "file", b"x")])]}), tmp_path / "noi.parquet")
    with pytest.raises(HarborTaskError, match="no instruction.md"):
        load_task_set(tmp_path / "noi.parquet")
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(HarborTaskError, match=".parquet"):
        load_task_set(tmp_path / "x.csv")


def test_pack_task_is_deterministic(tmp_path):
    t = SHIPPED_TASKS_DIR / "write-file-000"
    assert pack_task(t) == pack_task(t)


# ------------------------------------------------------------------------------------------------
# families and the shipped set


def test_shipped_set_is_what_the_script_generates():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_terminal_tasks", Path(__file__).resolve().parents[1] / "scripts" / "make_terminal_tasks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0


def test_shipped_set_loads_with_oracles_and_transcripts():
    tasks = load_task_set(SHIPPED_TASKS_DIR)
    assert 30 <= len(tasks) <= 60
    fams = {t.config.metadata["family"] for t in tasks}
    assert fams == set(FAMILIES)
    for t in tasks:
        assert t.has_oracle and t.config.allow_internet is False
        transcript = load_transcript(t.path)
        assert transcript and all(c["keystrokes"].endswith("\n") and c["duration"] > 0 for c in transcript)
        solve = (t.path / "solution" / "solve.sh").read_text()
        assert solve.endswith("".join(c["keystrokes"] for c in transcript))
    assert {t.environment.profile for t in tasks} == {"shell", "python"}
    size = sum(p.stat().st_size for p in SHIPPED_TASKS_DIR.rglob("*") if p.is_file())
    assert size < 200_000  # text only


def test_families_are_seeded_and_varied(tmp_path):
    for fam in FAMILIES:
        a, b = make_task(fam, 3), make_task(fam, 3)
        assert a.all_files() == b.all_files(), fam
    # seeds below the family's size are distinct tasks: disjoint seed ranges = disjoint splits
    assert len({make_task("write-file", s).instruction for s in range(2000)}) == 2000
    assert len({make_task("py-return", s).instruction for s in range(3000)}) == 3000
    assert make_task("write-file", 2000).instruction == make_task("write-file", 0).instruction
    with pytest.raises(KeyError, match="unknown task family 'nope'"):
        make_task("nope", 0)
    from jaxrl.envs.harbor import generate_tasks

    dirs = generate_tasks("write-file", range(100, 103), tmp_path)
    assert [d.name for d in dirs] == ["write-file-100", "write-file-101", "write-file-102"]
    assert load_task(dirs[0]).config.metadata == {"family": "write-file", "difficulty": 1, "seed": 100,
                                                  "author": "jaxrl scripts/make_terminal_tasks.py"}
    assert filecmp.cmp(dirs[0] / "task.toml", dirs[0] / "task.toml", shallow=False)


def test_shell_form_run_starting_with_a_bracket_is_not_exec_form(tmp_path):
    """Regression: `RUN [ ! -e ... ] && ln -s ... || true` is shell form (not a JSON array of strings);
    it was refused as "invalid JSON exec form"."""
    spec = _env(tmp_path, "FROM ubuntu:24.04\n"
                          "RUN [ ! -e /usr/bin/python ] && ln -s /usr/bin/python3 /usr/bin/python || true\n"
                          'RUN ["/bin/sh", "-c", "mkdir -p /app/data"]\n'
                          'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
                          "RUN mkdir -p /app/more\n"
                          'COPY --chmod=755 ["run me.sh", "/app/"]\n',
                files={"run me.sh": "r"})
    assert spec.mkdirs == ("/app/data", "/app/more")
    assert [(os.path.basename(s), d, m) for s, d, m in spec.copies] == [("run me.sh", "/app/run me.sh", 0o755)]
    assert any("line 4: SHELL" in n for n in spec.notes)
    # a JSON array that is not all strings is shell form too: `[1, 2]` runs the command `[1,` -> refused as a command
    with pytest.raises(UnsupportedEnvironmentError, match=r"line 2.*command `\[1,`"):
        _env(tmp_path, "FROM ubuntu:24.04\nRUN [1, 2]\n")
    with pytest.raises(UnsupportedEnvironmentError, match="line 2.*SHELL takes only the JSON form"):
        _env(tmp_path, "FROM ubuntu:24.04\nSHELL /bin/bash -c\n")
