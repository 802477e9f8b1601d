"""Sandbox benchmark: trials per second and the sandbox's start-up overhead per trial, each against a
bare `subprocess` run of the same commands measured in the same process.

A trial here is a fixed list of shell commands: three agent commands and the verifier's test.sh
(bash; it writes /logs/verifier/reward.txt). The sandboxed run is a real `Trial` (directories,
cgroup or rlimits, one bwrap instance per command, reward read back, cleanup); the bare run is
`subprocess.run(["bash", "-c", cmd], cwd=tmpdir)` of the same command texts, with /app and
/logs/verifier pointed at temporary directories. Printed:

1. sequential: ms per trial bare vs sandboxed, the overhead per trial and per command;
2. concurrent: trials/s bare vs sandboxed with `--concurrency` trials at once (default: CPU cores);
3. the persistent shell: start-up until the first prompt, and one command round trip;
4. with `--shipped`: trials/s of the sanity gate (oracle + empty agent) over the shipped task set.

Usage: python bench/sandbox_overhead.py [--trials 20 --concurrency N --shipped]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT_COMMANDS = ["echo hello > out.txt", "ls -la > listing.txt && wc -l listing.txt", "cat out.txt | tr a-z A-Z"]
TEST_SH = ('cd /app && if [ "$(cat out.txt)" = hello ]; then echo 1 > /logs/verifier/reward.txt; '
           'else echo 0 > /logs/verifier/reward.txt; fi')


def make_bench_task(root: Path):
    from jaxrl.envs.harbor import load_task

    d = root / "bench-task"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text("Write hello to /app/out.txt.\n")
    (d / "task.toml").write_text('schema_version = "1.1"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n'
                                 '[environment]\nmemory_mb = 512\nstorage_mb = 64\nallow_internet = false\n')
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + TEST_SH + "\n")
    return load_task(d)


def bare_trial(root: Path) -> float:
    """The same commands with plain subprocesses; returns the reward."""
    d = Path(tempfile.mkdtemp(dir=root))
    app, logs = d / "app", d / "verifier"
    app.mkdir()
    logs.mkdir()
    for cmd in AGENT_COMMANDS:
        subprocess.run(["bash", "-c", cmd], cwd=app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    test = TEST_SH.replace("/app", str(app)).replace("/logs/verifier", str(logs))
    subprocess.run(["bash", "-c", test], cwd=app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    reward = float((logs / "reward.txt").read_text())
    subprocess.run(["rm", "-rf", str(d)])
    return reward


def sandboxed_trial(task, root: Path) -> float:
    from jaxrl.envs.harbor import Trial, TrialConfig

    trial = Trial(task, Path(tempfile.mkdtemp(dir=root)) / "t", TrialConfig(keep="none")).start()
    for cmd in AGENT_COMMANDS:
        trial.exec(cmd)
    v = trial.verify()
    trial.close()
    return v.reward


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        assert fn() == 1.0
        out.append(time.perf_counter() - t)
    return out


def throughput(fn, n: int, concurrency: int) -> float:
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        rewards = list(ex.map(lambda _: fn(), range(n)))
    assert rewards == [1.0] * n
    return n / (time.perf_counter() - t)


def main(argv=None):
    from jaxrl.envs.harbor import SandboxConfig, Terminal, Trial, TrialConfig, check_sandbox, default_concurrency

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20, help="trials per measurement")
    p.add_argument("--concurrency", type=int, default=None, help="trials at once (default: CPU cores)")
    p.add_argument("--shipped", action="store_true", help="also time the sanity gate over the shipped set")
    args = p.parse_args(argv)
    conc = args.concurrency or default_concurrency()
    n = args.trials
    print(f"sandbox limits backend: {check_sandbox(SandboxConfig())}; {n} trials of {len(AGENT_COMMANDS)} agent "
          f"commands + test.sh; concurrency {conc}; {os.cpu_count()} CPUs (timings on a shared machine vary)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        task = make_bench_task(root)
        sandboxed_trial(task, root), bare_trial(root)  # warm-up (profile dir, seccomp file, page cache)
        bare = timed(lambda: bare_trial(root), n)
        sand = timed(lambda: sandboxed_trial(task, root), n)
        b, s = statistics.median(bare), statistics.median(sand)
        cmds = len(AGENT_COMMANDS) + 1
        print(f"sequential  bare {b * 1e3:7.1f} ms/trial (min {min(bare) * 1e3:.1f})   sandboxed {s * 1e3:7.1f} ms/trial "
              f"(min {min(sand) * 1e3:.1f})   overhead {(s - b) * 1e3:.1f} ms/trial = {(s - b) / cmds * 1e3:.1f} ms per "
              f"command   ratio sandboxed/bare = {s / b:.2f}")
        tb = throughput(lambda: bare_trial(root), n, conc)
        ts = throughput(lambda: sandboxed_trial(task, root), n, conc)
        print(f"concurrent  bare {tb:7.1f} trials/s   sandboxed {ts:7.1f} trials/s   ratio sandboxed/bare = {ts / tb:.2f}")
        starts, rtts = [], []
        for _ in range(max(3, n // 4)):
            trial = Trial(task, Path(tempfile.mkdtemp(dir=root)) / "t", TrialConfig(keep="none")).start()
            t = time.perf_counter()
            term = trial.terminal
            starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            trial.send_keys("echo hi\n", duration=10)
            rtts.append(time.perf_counter() - t)
            assert "hi" in term.read_new_output()
            trial.close()
        t = time.perf_counter()
        for _ in range(10):
            subprocess.run(["bash", "-c", "echo hi"], stdout=subprocess.PIPE)
        bare_cmd = (time.perf_counter() - t) / 10
        print(f"terminal    shell start to first prompt {statistics.median(starts) * 1e3:.1f} ms; one command round "
              f"trip {statistics.median(rtts) * 1e3:.1f} ms (bare `bash -c` {bare_cmd * 1e3:.1f} ms)")
    if args.shipped:
        from jaxrl.envs.harbor import SHIPPED_TASKS_DIR, check_tasks, load_task_set

        tasks = load_task_set(SHIPPED_TASKS_DIR)
        t = time.perf_counter()
        checks = check_tasks(tasks, concurrency=conc)
        dt = time.perf_counter() - t
        print(f"shipped set {2 * len(tasks)} gate trials (oracle + empty agent; pytest verifiers included) in "
              f"{dt:.1f} s = {2 * len(tasks) / dt:.2f} trials/s; {sum(c.passed for c in checks)}/{len(tasks)} pass")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
