"""Helpers for the Harbor tests: small task directories written in the test, process scans."""
from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path

from jaxrl.envs.harbor import SandboxConfig, check_sandbox, load_task

SHELL_DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\n"
PY_DOCKERFILE = "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y python3 python3-pytest\nWORKDIR /app\n"

# Reward 1 iff /app/done.txt holds "done" (an empty /app gets 0).
DONE_TEST = ('#!/bin/bash\nif [ "$(cat /app/done.txt 2>/dev/null)" = done ]; then echo 1 > /logs/verifier/reward.txt; '
             'else echo 0 > /logs/verifier/reward.txt; fi\n')
DONE_SOLVE = "#!/bin/bash\necho done > /app/done.txt\n"


def write_task_dir(root, name="t", *, test_sh=DONE_TEST, solve_sh=DONE_SOLVE, dockerfile=SHELL_DOCKERFILE,
                   files=None, toml=None, instruction="Write done to /app/done.txt.") -> Path:
    d = Path(root) / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "task.toml").write_text(toml if toml is not None else textwrap.dedent(f"""\
        schema_version = "1.1"
        [task]
        name = "test/{name}"
        [agent]
        timeout_sec = 60.0
        [verifier]
        timeout_sec = 30.0
        [environment]
        memory_mb = 512
        storage_mb = 64
        allow_internet = false
        """))
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test.sh").write_text(test_sh)
    os.chmod(d / "tests" / "test.sh", 0o755)
    if solve_sh is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(solve_sh)
    for rel, text in (files or {}).items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


def make_task(root, name="t", **kw):
    return load_task(write_task_dir(root, name, **kw))


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def descendants(pid: int) -> list[int]:
    """Host pids of every descendant of `pid` (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def limit_configs() -> list[tuple[str, SandboxConfig]]:
    """The limit backends this host can run: the default (cgroups when writable, else rlimits) and, as
    root, rlimits with an unprivileged host uid (the path a root host without writable cgroups takes)."""
    base = SandboxConfig(max_processes=64, max_memory_mb=256, max_storage_mb=64, disk_check_interval_sec=0.2)
    out = [(check_sandbox(base), base)]
    if os.geteuid() == 0:
        import dataclasses

        out.append(("rlimit-uid65534", dataclasses.replace(base, limits_backend="rlimit", host_uid=65534)))
    return out


def traversable_tmpdir() -> Path:
    """A fresh directory under /tmp that any uid may traverse (for sandboxes run as another host uid)."""
    d = Path(tempfile.mkdtemp(prefix="jaxrl-test-trials-", dir="/tmp"))
    os.chmod(d, 0o711)
    return d


# The start of the escape-probe scripts run inside a sandbox (tests/test_sandbox.py and
# tests/test_image_backend.py): `probe(name, fn)` records "ESCAPED: ..." when fn returns and
# "blocked: ..." when it raises, then the network probes both backends share.
PROBE_PRELUDE = r'''
E = os.environ
res = {}
def probe(name, fn):
    try:
        res[name] = "ESCAPED: " + repr(fn())[:200]
    except Exception as e:
        res[name] = "blocked: " + type(e).__name__ + " " + str(e)[:100]
def tcp(host, port):
    s = socket.create_connection((host, port), timeout=3); s.close(); return "connected"
def raise_if(cond, what):
    if cond: return what
    raise RuntimeError("not possible")
probe("tcp_host_loopback", lambda: tcp("127.0.0.1", int(E["HOST_PORT"])))
probe("tcp_host_ip", lambda: tcp(E["HOST_IP"], int(E["HOST_PORT"])))
probe("tcp_outside", lambda: tcp("1.1.1.1", 80))
probe("dns", lambda: socket.getaddrinfo("example.com", 80))
def abstract():
    s = socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect("\0" + E["ABSTRACT"]); return "connected"
probe("abstract_unix_socket", abstract)
'''
