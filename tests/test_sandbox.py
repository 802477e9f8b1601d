"""Sandbox tests: escape attempts from inside a trial and the resource limits.

Escape attempts, every one must be blocked (47):

* 34 probes run inside the sandbox (`ESCAPE_PROBES`): TCP to the host's loopback listener, to the
  host's IP and to the outside, DNS, the host's abstract unix socket; reading the host's home, the run
  directory and a live neighbour trial's /app; seeing /tests, /solution or /logs/verifier as the agent;
  writing /usr, /etc, /, /opt/jaxrl, the bound Python prefix, /dev, /proc/sysrq-trigger and
  /proc/sys (global sysctls); unshare(user), unshare(net), mount; uid 0 / capabilities /
  no_new_privs; su; signalling a host pid; /dev/tty (TIOCSTI); /sys and cgroupfs; leaked file
  descriptors; hard links out of /app; ptrace, keyctl, bpf, io_uring, open_by_handle_at (seccomp).
* 13 host-side ones: reward.txt and test-stdout.txt as symlinks to host files, removing / moving the
  /logs/verifier mount and writing /tests during verification, symlinks in /app and /logs/agent
  pointing at host directories, files and /usr (cleanup and disk accounting must not follow them),
  chmod 000 directories left for the cleanup, and (in test_harbor_trials.py) a FIFO or a directory
  named reward.txt and a symlinked verifier directory.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import threading
import time

import pytest

from harbor_helpers import (PROBE_PRELUDE, PY_DOCKERFILE, descendants, limit_configs, make_task, processes_with,
                            traversable_tmpdir)


@pytest.fixture
def root():
    """A trial root any host uid may traverse (the rlimit backend runs sandboxes as uid 65534)."""
    d = traversable_tmpdir()
    yield d
    remove_tree(d)

from jaxrl.envs.harbor import (AgentTimeoutError, Outcome, Sandbox, SandboxConfig, Trial, TrialConfig, run_trial)
from jaxrl.envs.harbor.sandbox import disk_usage, read_file_nofollow, remove_tree

ESCAPE_PROBES = r'''
import ctypes, errno, json, os, socket, subprocess, sys
''' + PROBE_PRELUDE + r'''probe("read_host_home", lambda: open(E["HOME_SECRET"]).read())
probe("read_run_dir", lambda: open(E["RUN_SECRET"]).read())
probe("read_other_trial", lambda: open(E["OTHER_TRIAL_FILE"]).read())
probe("tests_visible", lambda: raise_if(os.path.exists("/tests"), os.listdir("/tests")))
probe("solution_visible", lambda: raise_if(os.path.exists("/solution"), os.listdir("/solution")))
probe("verifier_logs_visible", lambda: raise_if(os.path.exists("/logs/verifier"), "exists"))
def write(p):
    with open(p, "w") as f: f.write("x")
    return "wrote " + p
probe("write_usr", lambda: write("/usr/escape"))
probe("write_etc", lambda: write("/etc/passwd"))
probe("write_root", lambda: write("/escape"))
probe("write_opt_jaxrl", lambda: write("/opt/jaxrl/bin/python3"))
probe("write_python_prefix", lambda: write(os.path.join(sys.base_prefix, "escape")))
probe("write_dev", lambda: write("/dev/escape"))
probe("write_sysrq", lambda: write("/proc/sysrq-trigger"))
probe("write_proc_sys", lambda: write("/proc/sys/kernel/hostname"))
libc = ctypes.CDLL(None, use_errno=True)
def call(rc_fn):
    rc = rc_fn()
    if rc != 0: raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "succeeded"
probe("unshare_user", lambda: call(lambda: libc.unshare(0x10000000)))
probe("unshare_net", lambda: call(lambda: libc.unshare(0x40000000)))
probe("mount_tmpfs", lambda: call(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
def caps():
    st = open("/proc/self/status").read()
    eff = [l for l in st.splitlines() if l.startswith("CapEff")][0].split()[1]
    nnp = [l for l in st.splitlines() if l.startswith("NoNewPrivs")][0].split()[1]
    return raise_if(int(eff, 16) != 0 or nnp != "1" or os.getuid() == 0, (eff, nnp, os.getuid()))
probe("capabilities_or_uid0", caps)
probe("su_root", lambda: raise_if(subprocess.run(["su", "-c", "id", "root"], capture_output=True, timeout=5,
                                               stdin=subprocess.DEVNULL).returncode == 0, "su worked"))
def host_pid():
    os.kill(int(E["HOST_PID"]), 0); return "host pid visible"
probe("signal_host_pid", host_pid)
probe("dev_tty_tiocsti", lambda: open("/dev/tty", "w"))
probe("sys_cgroupfs", lambda: raise_if(os.path.exists("/sys/fs/cgroup") or os.path.exists("/sys/kernel"), "sys"))
def fds():
    open_fds = sorted(int(x) for x in os.listdir("/proc/%d/fd" % os.getppid()))
    return raise_if(any(fd > 2 for fd in open_fds), open_fds)
probe("leaked_fds", fds)
probe("hardlink_out", lambda: (os.link("/usr/bin/bash", "/app/bash_link"), "linked")[1])
import platform
col = 0 if platform.machine() == "x86_64" else 1
libc.syscall.restype = ctypes.c_long
def sysc(nums, *args):
    return call(lambda: 0 if libc.syscall(nums[col], *args) >= 0 else 1)
probe("seccomp_ptrace_attach", lambda: sysc((101, 117), 16, 1, 0, 0))            # PTRACE_ATTACH pid 1
probe("seccomp_keyctl", lambda: sysc((250, 219), 0, ctypes.c_long(-4), 0))       # KEYCTL_GET_KEYRING_ID @u
probe("seccomp_bpf", lambda: sysc((321, 280), 0, 0, 0))
probe("seccomp_io_uring", lambda: sysc((425, 425), 1, ctypes.create_string_buffer(120)))
probe("seccomp_open_by_handle", lambda: sysc((304, 265), ctypes.c_int(-100), ctypes.create_string_buffer(64), 0))
print("PROBES" + json.dumps(res))
'''


class _Listener:
    """A host TCP listener on 127.0.0.1 and an abstract unix socket, counting connections."""

    def __init__(self):
        self.hits = 0
        self.tcp = socket.socket()
        self.tcp.bind(("0.0.0.0", 0))
        self.tcp.listen(8)
        self.port = self.tcp.getsockname()[1]
        self.abstract = f"jaxrl-test-{os.getpid()}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.abstract)
        self.unix.listen(8)
        self._stop = False
        for s in (self.tcp, self.unix):
            s.settimeout(0.2)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s):
        while not self._stop:
            try:
                c, _ = s.accept()
                self.hits += 1
                c.close()
            except (socket.timeout, OSError):
                pass

    def close(self):
        self._stop = True
        self.tcp.close()
        self.unix.close()


def _host_ip() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.2"
    finally:
        s.close()


def test_escape_attempts_are_blocked(tmp_path):
    """34 in-sandbox probes, run while a second trial is live; the host listener sees no connection."""
    listener = _Listener()
    home_secret = os.path.join(os.path.expanduser("~"), f".jaxrl-test-secret-{os.getpid()}")
    with open(home_secret, "w") as f:
        f.write("host secret")
    run_secret = tmp_path / "secret.txt"
    run_secret.write_text("run dir secret")
    task = make_task(tmp_path / "tasks", dockerfile=PY_DOCKERFILE)
    cfg = TrialConfig()
    other = Trial(task, tmp_path / "trials" / "other", cfg).start()
    other.exec("echo other > /app/other.txt")
    trial = Trial(task, tmp_path / "trials" / "probe", cfg).start()
    try:
        env = {"HOST_PORT": str(listener.port), "HOST_IP": _host_ip(), "ABSTRACT": listener.abstract,
               "HOME_SECRET": home_secret, "RUN_SECRET": str(run_secret),
               "OTHER_TRIAL_FILE": str(other.dir / "app" / "other.txt"), "HOST_PID": str(os.getpid())}
        r = trial.exec("python3 - <<'EOF'\n" + ESCAPE_PROBES + "EOF", timeout=60, env=env)
        line = [l for l in r.output.splitlines() if l.startswith("PROBES")]
        assert line, r.output
        res = json.loads(line[0][len("PROBES"):])
        assert len(res) == 34
        print(json.dumps(res, indent=1))
        escaped = {k: v for k, v in res.items() if not v.startswith("blocked")}
        assert not escaped, escaped
        assert listener.hits == 0
        # the files the probes tried to read exist on the host (so "blocked" is not a typo in a path)
        assert (other.dir / "app" / "other.txt").read_text() == "other\n"
        assert not (other.dir / "app" / "bash_link").exists()
    finally:
        listener.close()
        os.remove(home_secret)
        trial.close()
        other.close()


def test_host_never_follows_symlinks_the_sandbox_leaves(tmp_path):
    """reward.txt / test-stdout.txt as symlinks to host files, /logs/verifier removal, /tests writes."""
    host_file = tmp_path / "host_reward.txt"
    host_file.write_text("1\n")
    test_sh = textwrap.dedent(f"""\
        #!/bin/bash
        rmdir /logs/verifier 2>/dev/null && echo REMOVED_MOUNT
        mv /logs/verifier /logs/v2 2>/dev/null && echo MOVED_MOUNT
        echo x > /tests/planted 2>/dev/null && echo WROTE_TESTS
        ln -s {host_file} /logs/verifier/reward.txt
        ln -s {host_file} /logs/verifier/test-stdout.txt.tmp
        """)
    task = make_task(tmp_path / "tasks", test_sh=test_sh)
    r = run_trial(task, config=TrialConfig(keep="all"), trial_dir=tmp_path / "trial")
    assert r.outcome == Outcome.REWARD_UNPARSABLE and r.reward == 0.0
    assert "symlink" in r.error
    assert "REMOVED_MOUNT" not in r.test_output and "MOVED_MOUNT" not in r.test_output
    assert "WROTE_TESTS" not in r.test_output
    assert host_file.read_text() == "1\n"
    # test-stdout.txt itself replaced by a symlink: the host reads nothing through it
    test_sh2 = f"#!/bin/bash\nrm -f /logs/verifier/test-stdout.txt; ln -s {host_file} /logs/verifier/test-stdout.txt\n" \
               "echo 0 > /logs/verifier/reward.txt\n"
    task2 = make_task(tmp_path / "tasks", "t2", test_sh=test_sh2)
    r2 = run_trial(task2, config=TrialConfig(), trial_dir=tmp_path / "trial2")
    assert r2.outcome == Outcome.OK and r2.test_output == ""


def test_cleanup_and_disk_count_do_not_follow_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x" * 100000)
    task = make_task(tmp_path / "tasks")

    def agent(trial):
        # links the host would follow if it were careless; a directory the agent made unreadable
        trial.exec(f"ln -s {outside} /app/out; ln -s {outside}/keep.txt /app/f; ln -s /usr /app/usr; "
                   "ln -s /usr /logs/agent/usr; mkdir -p /app/locked/sub && echo x > /app/locked/sub/y && "
                   "chmod 000 /app/locked/sub /app/locked")
        used, n = trial.sandbox.disk_usage()
        assert used < 1 << 20 and n < 20  # /usr and `outside` are not counted through the links

    r = run_trial(task, agent, config=TrialConfig(keep="logs"), trial_dir=tmp_path / "trial")
    assert r.outcome == Outcome.OK, r
    assert (outside / "keep.txt").read_text() == "x" * 100000
    assert not (tmp_path / "trial" / "app").exists()
    assert os.path.islink(tmp_path / "trial" / "logs" / "agent" / "usr")  # kept, never followed
    assert os.path.exists("/usr/bin/bash")
    # the primitives themselves
    d = tmp_path / "d"
    d.mkdir()
    os.symlink(outside, d / "link")
    assert read_file_nofollow(d, "link", 10) == (None, "is a symlink")
    assert disk_usage([d])[1] == 1
    remove_tree(d)
    assert not d.exists() and (outside / "keep.txt").exists()


@pytest.mark.parametrize("name,config", limit_configs(), ids=[n for n, _ in limit_configs()])
def test_fork_bomb_is_capped_and_trial_scores_zero(name, config, root):
    """The classic bash fork bomb: the host samples the sandbox's process tree while it runs; it never
    exceeds the process limit, the command timeout ends it, nothing survives, and the trial still
    verifies (reward 0, outcome ok) with the limit recorded."""
    task = make_task(root / "tasks")

    def agent(trial):
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(sum(len(descendants(p.pid)) for p in list(trial.sandbox._procs)))
                time.sleep(0.05)

        th = threading.Thread(target=sample)
        th.start()
        r = trial.exec("bomb() { bomb | bomb & }; bomb; sleep 10", timeout=4)
        stop.set()
        th.join()
        assert r.timed_out
        trial.info["max_procs"] = max(samples)
        bwrap_pids = [p.pid for p in trial.sandbox._procs]
        assert not bwrap_pids

    r = run_trial(task, agent, config=TrialConfig(sandbox=config), trial_dir=root / "trial")
    assert r.outcome == Outcome.OK and r.reward == 0.0, r
    # bwrap's monitor process runs outside the sandbox's user namespace (+1)
    assert 32 <= r.info["max_procs"] <= config.max_processes + 1, r.info
    assert r.limits_hit.get("timeout") == 1
    if name == "cgroup":
        assert r.limits_hit.get("pids", 0) >= 1


@pytest.mark.parametrize("name,config", limit_configs(), ids=[n for n, _ in limit_configs()])
def test_memory_bomb_is_stopped_at_the_limit(name, config, root):
    """awk doubles a string until the memory limit stops it; it never gets past 256 MB."""
    task = make_task(root / "tasks")

    def agent(trial):
        r = trial.exec("awk 'BEGIN { s = \"xxxxxxxxxxxxxxxx\"; while (1) { s = s s; print length(s); fflush() } }'",
                       timeout=30)
        sizes = [int(x) for x in r.output.split() if x.isdigit()]
        assert sizes and max(sizes) <= 256 << 20, r.output[-500:]
        assert r.exit_code != 0 and not r.timed_out
        if name == "cgroup":
            assert r.limit == "memory"
        trial.info["max_string"] = max(sizes)

    r = run_trial(task, agent, config=TrialConfig(sandbox=config), trial_dir=root / "trial")
    assert r.outcome == Outcome.OK and r.reward == 0.0, r
    assert r.info["max_string"] >= 16 << 20  # it did allocate, up to the limit
    if name == "cgroup":
        assert r.limits_hit.get("memory") == 1


@pytest.mark.parametrize("name,config", limit_configs(), ids=[n for n, _ in limit_configs()])
def test_disk_filler_is_stopped(name, config, root):
    """One big file hits RLIMIT_FSIZE at storage_mb; many small files are stopped by the disk monitor."""
    task = make_task(root / "tasks")

    def agent(trial):
        r = trial.exec("dd if=/dev/zero of=/app/big bs=1M count=500 2>&1; echo rc=$?", timeout=30)
        assert os.path.getsize(trial.dir / "app" / "big") <= 64 << 20
        assert "rc=153" in r.output or "File size limit" in r.output, r.output  # SIGXFSZ
        trial.exec("rm /app/big")
        r = trial.exec("for i in $(seq 500); do head -c 1048576 /dev/zero > /tmp/f$i || break; done", timeout=60)
        assert r.limit == "disk" and r.exit_code is None, r
        used, _ = trial.sandbox.disk_usage()
        trial.info["disk_mb_at_kill"] = used >> 20
        # the files stay: the monitor sees the trial over its limit at every check from now on, and
        # must still count one crossing (it counted one per check: 2 on a loaded CI host). Waits
        # for 5 more of its checks (counted, not a fixed sleep).
        checks, real_over_disk = [], trial.sandbox.over_disk
        trial.sandbox.over_disk = lambda *a, **k: checks.append(1) or real_over_disk(*a, **k)
        deadline = time.monotonic() + 120
        while len(checks) < 5:
            assert time.monotonic() < deadline, "the disk monitor stopped checking"
            time.sleep(0.01)

    r = run_trial(task, agent, config=TrialConfig(sandbox=config), trial_dir=root / "trial")
    assert r.outcome == Outcome.OK and r.reward == 0.0, r
    assert r.limits_hit.get("disk") == 1
    # overshoot bounded by one check interval of writing (0.2 s); generous bound for a loaded CI host
    assert 64 <= r.info["disk_mb_at_kill"] < 64 + 400


def test_verifier_runs_when_the_agent_left_the_trial_over_its_disk_limit(root):
    """The agent's files (over storage_mb) stay; the verifier still scores the trial, with its own
    storage_mb on top of them, and a verifier that writes past that allowance is stopped."""
    config = limit_configs()[0][1]
    fill = "for i in $(seq 500); do head -c 1048576 /dev/zero > /tmp/f$i || break; done"

    def agent(trial):
        r = trial.exec(fill, timeout=60)
        assert r.limit == "disk", r

    # slow enough for several disk checks, writes 8 MB (allowed), then scores 1
    calm = ("#!/bin/bash\nsleep 1.5\nhead -c 8388608 /dev/zero > /tmp/verifier.bin\nsleep 0.5\n"
            "echo 1 > /logs/verifier/reward.txt\n")
    r = run_trial(make_task(root / "tasks", "calm", test_sh=calm), agent, config=TrialConfig(sandbox=config),
                  trial_dir=root / "calm")
    assert r.outcome == Outcome.OK and r.reward == 1.0, r
    assert r.limits_hit.get("disk") == 1, r.limits_hit

    greedy = ("#!/bin/bash\nfor i in $(seq 300); do head -c 1048576 /dev/zero > /tmp/v$i; done\nsleep 5\n"
              "echo 1 > /logs/verifier/reward.txt\n")
    r = run_trial(make_task(root / "tasks", "greedy", test_sh=greedy), agent, config=TrialConfig(sandbox=config),
                  trial_dir=root / "greedy")
    assert r.outcome == Outcome.REWARD_MISSING and r.reward == 0.0, r
    assert r.limits_hit.get("disk") == 2, r.limits_hit  # the agent's crossing and the verifier's


def test_never_ending_commands_and_agent_budget(tmp_path, monkeypatch):
    """A command is cut at its timeout; the agent budget cuts everything, the verifier still runs.
    No wall clock: what each limit cut is told by what ran (the line after a cut command never
    runs, a command shorter than its timeout is not cut) and by the exception that ended the agent."""
    task = make_task(tmp_path / "tasks")
    t_agent = {}

    def agent(trial):
        r = trial.exec("sleep 1000; echo late", timeout=1)
        assert r.timed_out and r.limit == "timeout" and r.exit_code is None and "late" not in r.output
        r = trial.exec("sleep 0.3; echo in-time", timeout=30)  # not cut early
        assert not r.timed_out and r.exit_code == 0 and "in-time" in r.output, r
        trial.exec("echo done > /app/done.txt")
        try:
            trial.exec("while true; do :; done", timeout=60)
        except AgentTimeoutError:  # the 3 s budget, not the command's 60 s timeout (which returns a result)
            t_agent["raised"] = True
            raise

    r = run_trial(task, agent, config=TrialConfig(agent_timeout_sec=3), trial_dir=tmp_path / "trial")
    assert r.outcome == Outcome.AGENT_TIMEOUT
    assert r.reward == 1.0  # Harbor's rule: the verifier still scores the work done before the timeout
    assert t_agent == {"raised": True}
    assert r.limits_hit.get("timeout") == 1

    # a hung agent (stuck outside the sandbox) cannot hold the trial past its deadline
    from jaxrl.envs.harbor import runner

    monkeypatch.setattr(runner, "AGENT_GRACE_SEC", 0.5)

    release, hung_ended = threading.Event(), []

    def hung(trial):
        hung_ended.append(release.wait(120))

    r = run_trial(task, hung, config=TrialConfig(agent_timeout_sec=1), trial_dir=tmp_path / "trial2")
    assert r.outcome == Outcome.AGENT_TIMEOUT and r.reward == 0.0
    assert hung_ended == []  # the trial ended (deadline + grace) while its agent was still stuck
    release.set()


def test_cpu_time_limit(tmp_path):
    task = make_task(tmp_path / "tasks")
    cfg = TrialConfig(sandbox=SandboxConfig(cpu_time_sec=1))
    with Trial(task, tmp_path / "trial", cfg) as trial:
        r = trial.exec("while :; do :; done", timeout=30)
        # SIGXCPU: the 1 s CPU limit ended it, not the 30 s timeout (limit "timeout"); no wall-clock bound
        assert r.limit == "cpu_time" and r.exit_code == 128 + signal.SIGXCPU
    assert trial.result().limits_hit == {"cpu_time": 1}


def test_background_processes_do_not_survive(tmp_path):
    task = make_task(tmp_path / "tasks")
    m = f"{os.getpid()}.{int(time.time())}"  # unique sleep durations
    with Trial(task, tmp_path / "trial", TrialConfig()) as trial:
        r = trial.exec(f"nohup sleep 1{m} >/dev/null 2>&1 & setsid sleep 2{m} & (sleep 3{m} &) ; echo started")
        assert "started" in r.output
        # Killed with the command's sandbox; SIGKILL takes effect asynchronously, so a loaded host can
        # still list one for a moment after exec returns (seen once in 900 runs of the suite).
        assert _gone([f"1{m}", f"2{m}", f"3{m}"]), [processes_with(f"{i}{m}") for i in (1, 2, 3)]
        trial.send_keys(f"nohup sleep 4{m} >/dev/null 2>&1 &\n", 2)
        trial.send_keys(f"setsid sleep 5{m} & disown\n", 2)
        trial.send_keys(f"(setsid sleep 6{m} &)\n", 2)
        # they run (polled with a generous deadline: on a loaded host the last one can start late)
        deadline = time.monotonic() + 15
        while not all(processes_with(f"{i}{m}") for i in (4, 5, 6)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(f"4{m}") and processes_with(f"5{m}") and processes_with(f"6{m}")
        v = trial.verify()  # as in Harbor, the agent's processes live through verification ...
        assert v.outcome == Outcome.OK
        assert processes_with(f"4{m}") and processes_with(f"5{m}") and processes_with(f"6{m}")
    # ... and die with the trial
    assert _gone([f"4{m}", f"5{m}", f"6{m}"]), [processes_with(f"{i}{m}") for i in (4, 5, 6)]
    with Trial(task, tmp_path / "trial2", TrialConfig(stop_agent_processes=True)) as trial:
        trial.send_keys(f"setsid sleep 7{m} & disown\n", 2)
        deadline = time.monotonic() + 15
        while not processes_with(f"7{m}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(f"7{m}")
        trial.verify()  # stop_agent_processes: killed before the verifier runs
        assert _gone([f"7{m}"]), processes_with(f"7{m}")


def _gone(markers, within: float = 5.0) -> bool:
    """True once no host process has any of `markers` in its command line, polled for `within` s."""
    deadline = time.monotonic() + within
    while any(processes_with(x) for x in markers):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sandbox_unavailable_is_a_clear_error(tmp_path):
    from jaxrl.envs.harbor import SandboxUnavailableError, check_sandbox

    with pytest.raises(SandboxUnavailableError, match="bubblewrap is not installed.*apt-get install -y bubblewrap"):
        check_sandbox(SandboxConfig(bwrap_path="/nonexistent/bwrap"))
    if os.geteuid() == 0:
        with pytest.raises(SandboxUnavailableError, match="host_uid"):
            check_sandbox(SandboxConfig(limits_backend="rlimit"))
    with pytest.raises(ValueError, match="sandbox.network"):
        SandboxConfig(network="bridge").validate()


def test_remove_tree_unlocks_directories_the_agent_locked():
    """Regression: as a non-root host user, cleanup of an /app with nested chmod 000 directories failed
    (the error handler re-called os.open without flags). Run as an unprivileged uid so that permissions
    apply even when the tests run as root."""
    import inspect
    import subprocess
    import sys

    from jaxrl.envs.harbor import sandbox

    root = traversable_tmpdir()
    try:
        tree = root / "app"
        (tree / "a" / "b" / "c").mkdir(parents=True)
        (tree / "a" / "b" / "c" / "f").write_text("x")
        os.symlink("/usr", tree / "a" / "usr")
        for d in (tree / "a" / "b" / "c", tree / "a" / "b", tree / "a"):
            os.chmod(d, 0)
        code = "import os, shutil, stat\n" + inspect.getsource(sandbox.remove_tree) + \
            f"\nremove_tree({str(tree)!r})\nprint('removed', not os.path.lexists({str(tree)!r}))\n"
        if os.geteuid() == 0:
            for dirpath, dirnames, filenames in os.walk(root):
                for n in [dirpath] + [os.path.join(dirpath, x) for x in dirnames + filenames]:
                    os.lchown(n, 65534, 65534)
            p = subprocess.run(["/usr/bin/python3", "-c", code], user=65534, group=65534, extra_groups=[],
                               capture_output=True, text=True, timeout=60)
        else:
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert p.stdout.strip() == "removed True", p.stderr
        assert os.path.exists("/usr/bin")
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(root)], capture_output=True)
        remove_tree(root)


def test_a_sandbox_python_installed_under_tmp_stays_visible(tmp_path):
    """Regression: the interpreter's directories were bound before the trial's private /tmp, which then
    covered them, so with a venv under /tmp on the host (a clone in /tmp) every pytest verifier failed
    with `exec: .../bin/python: not found` and reward 0 (found by a fresh-user review). A venv under
    tmp_path (which is under /tmp) whose .pth file reaches this interpreter's pytest runs an oracle to 1."""
    import json as _json
    import subprocess
    import sys as _sys

    import pytest as _pytest

    venv = tmp_path / "venv"
    subprocess.run([_sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    assert str(venv).startswith("/tmp/")
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "host_pytest.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(os.path.realpath(_pytest.__file__))) + "\n")
    env = {**os.environ, "JAXRL_SANDBOX_PYTHON": str(venv / "bin" / "python"), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([_sys.executable, "-m", "jaxrl.tasks", "run-oracle", "--task", "jaxrl/py-kata-caesar",
                          "--trials-dir", str(tmp_path / "trials")],  # not a folder left in /tmp
                         capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = out.stdout + out.stderr
    assert "not found" not in text, text[-2000:]
    body = text[text.index("{"):text.rindex("}") + 1]
    assert _json.loads(body)["reward"] == 1.0, text[-2000:]
