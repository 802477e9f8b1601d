"""Trials: verifier outcomes and reward parsing, the persistent terminal, the oracle transcripts, the
sanity gate (with a planted inverted verifier and a planted broken oracle), concurrency, the CLI."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harbor_helpers import DONE_TEST, PY_DOCKERFILE, make_task, processes_with, write_task_dir
from jaxrl.envs.harbor import (SHIPPED_TASKS_DIR, UNSAFE_HOST_BACKEND, AgentStop, AgentTimeoutError, Outcome,
                               SandboxConfig, SandboxError, Trial, TrialConfig, arun_trials, check_tasks, empty_agent,
                               format_check_table, keys_to_bytes, limit_output, load_task, load_task_set,
                               load_transcript, oracle_agent, parse_reward, run_trial, run_trials)
from jaxrl.envs.harbor import runner as runner_mod
from jaxrl.envs.harbor.terminal import clean_terminal_text

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# reward parsing (Harbor's rules, verbatim)


@pytest.mark.parametrize("files,reward,outcome", [
    ({"reward.txt": "1"}, 1.0, Outcome.OK),
    ({"reward.txt": " 0.25\n"}, 0.25, Outcome.OK),
    ({"reward.txt": "-3e-1"}, -0.3, Outcome.OK),
    ({"reward.txt": ""}, None, Outcome.REWARD_EMPTY),
    ({"reward.txt": "\n  \n"}, None, Outcome.REWARD_UNPARSABLE),  # Harbor: empty means 0 bytes
    ({"reward.txt": "yes"}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.txt": "1 1"}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.txt": "nan"}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.txt": "inf"}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.json": '{"reward": 0.5, "tests_passed": 3}'}, 0.5, Outcome.OK),
    ({"reward.json": '{"pass_ratio": 0.75}'}, 0.75, Outcome.OK),
    ({"reward.json": '{"a": 1, "b": 0}'}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.json": '[1]'}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.json": '{"reward": true}'}, 1.0, Outcome.OK),  # a bool is a number to Harbor
    ({"reward.json": '0.5'}, 0.5, Outcome.OK),
    ({"reward.json": '{"reward": NaN}'}, None, Outcome.REWARD_UNPARSABLE),
    ({"reward.json": ''}, None, Outcome.REWARD_EMPTY),
    ({"reward.txt": "0", "reward.json": '{"reward": 1}'}, 1.0, Outcome.OK),  # reward.json wins (Harbor)
    ({"reward.txt": "1", "reward.json": ''}, None, Outcome.REWARD_EMPTY),  # an empty reward.json is not skipped
    ({}, None, Outcome.REWARD_MISSING),
])
def test_parse_reward(tmp_path, files, reward, outcome):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    value, got, details = parse_reward(tmp_path)
    assert got == outcome, details
    assert value == (pytest.approx(reward) if reward is not None else None)


def test_parse_reward_never_follows_links_or_reads_specials(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("1")
    v = tmp_path / "v"
    v.mkdir()
    os.symlink(secret, v / "reward.txt")
    assert parse_reward(v)[:2] == (None, Outcome.REWARD_UNPARSABLE)
    os.remove(v / "reward.txt")
    os.mkfifo(v / "reward.txt")  # would block a naive reader
    assert parse_reward(v)[:2] == (None, Outcome.REWARD_UNPARSABLE)
    os.remove(v / "reward.txt")
    (v / "reward.txt").mkdir()
    assert parse_reward(v)[:2] == (None, Outcome.REWARD_UNPARSABLE)
    w = tmp_path / "w"
    os.symlink(v, w)  # the verifier directory itself as a link
    assert parse_reward(w)[1] == Outcome.REWARD_UNPARSABLE


# ------------------------------------------------------------------------------------------------
# verifier outcomes in real trials


def _outcome(tmp_path, name, test_sh, agent=None, **cfg):
    task = make_task(tmp_path / "tasks", name, test_sh=test_sh)
    return run_trial(task, agent, config=TrialConfig(**cfg), trial_dir=tmp_path / "trials" / name)


def test_verifier_outcomes(tmp_path):
    r = _outcome(tmp_path, "ok", "#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\nexit 3\n")
    assert (r.outcome, r.reward, r.verifier_exit_code) == (Outcome.OK, 0.5, 3)  # exit code ignored (Harbor)
    r = _outcome(tmp_path, "missing", "#!/bin/bash\necho tests failed\n")
    assert (r.outcome, r.reward) == (Outcome.REWARD_MISSING, 0.0) and "tests failed" in r.test_output
    r = _outcome(tmp_path, "empty", "#!/bin/bash\n: > /logs/verifier/reward.txt\n")
    assert (r.outcome, r.reward) == (Outcome.REWARD_EMPTY, 0.0)
    r = _outcome(tmp_path, "unparsable", "#!/bin/bash\necho PASSED > /logs/verifier/reward.txt\n")
    assert (r.outcome, r.reward) == (Outcome.REWARD_UNPARSABLE, 0.0) and "PASSED" in r.error
    r = _outcome(tmp_path, "json", "#!/bin/bash\necho '{\"reward\": 1, \"n\": 4}' > /logs/verifier/reward.json\n")
    assert (r.outcome, r.reward, r.rewards) == (Outcome.OK, 1.0, {"reward": 1.0, "n": 4.0})
    # The verifier is stopped at its timeout, not waited for: the line after its sleep never runs
    # (a marker in the trial's logs), and the sleep is gone (no wall-clock bound).
    probe = f"jaxrl-verifier-timeout-{os.getpid()}"
    r = _outcome(tmp_path, "slow", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
                 f"(exec -a {probe} sleep 100)\necho late > /logs/verifier/late.txt\n", verifier_timeout_sec=1)
    assert (r.outcome, r.reward) == (Outcome.VERIFIER_TIMEOUT, 0.0)
    assert not list((tmp_path / "trials" / "slow").rglob("late.txt"))
    deadline = time.monotonic() + 30  # SIGKILL takes effect asynchronously: polled, ends once it is gone
    while processes_with(probe) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_with(probe)
    assert list((tmp_path / "trials" / "slow").rglob("reward.txt"))  # the marker's folder is kept
    r = _outcome(tmp_path, "noshebang", "echo 1 > /logs/verifier/reward.txt\n")
    assert (r.outcome, r.reward) == (Outcome.OK, 1.0)


def test_agent_stops_and_errors_skip_verification(tmp_path):
    task = make_task(tmp_path / "tasks", test_sh="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")

    def overflow(trial):
        raise AgentStop(Outcome.CONTEXT_LENGTH_EXCEEDED, "32768 tokens")

    def crash(trial):
        raise KeyError("boom")

    r = run_trial(task, overflow, trial_dir=tmp_path / "a")
    assert (r.outcome, r.reward, r.error) == (Outcome.CONTEXT_LENGTH_EXCEEDED, 0.0, "32768 tokens")
    assert not (tmp_path / "a" / "logs" / "verifier" / "reward.txt").exists()
    r = run_trial(task, crash, trial_dir=tmp_path / "b")
    assert (r.outcome, r.reward) == (Outcome.AGENT_ERROR, 0.0) and "KeyError" in r.error
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "junk").write_text("x")  # a trial directory that is not empty: the sandbox refuses it
    r = run_trial(task, oracle_agent, trial_dir=tmp_path / "c")
    assert (r.outcome, r.reward) == (Outcome.SANDBOX_ERROR, 0.0) and "not empty" in r.error


def test_tests_and_solution_are_bound_only_when_they_should_be(tmp_path):
    test_sh = ('#!/bin/bash\nls /tests > /logs/verifier/seen.txt\n[ -e /solution ] && echo SOLUTION >> '
               '/logs/verifier/seen.txt\necho 1 > /logs/verifier/reward.txt\n')
    task = make_task(tmp_path / "tasks", test_sh=test_sh, solve_sh="#!/bin/bash\nls /solution > /app/sol.txt\n"
                     "ls /tests > /app/tests.txt 2>&1\n", files={"tests/test_x.py": "x"})
    with Trial(task, tmp_path / "t", TrialConfig(keep="all")) as trial:
        r = trial.exec("ls /tests /solution /logs 2>&1")
        assert "No such file" in r.output and "verifier" not in r.output
        trial.run_oracle()
        assert (trial.dir / "app" / "sol.txt").read_text() == "solve.sh\n"
        assert "No such file" in (trial.dir / "app" / "tests.txt").read_text()
        v = trial.verify()
        assert v.outcome == Outcome.OK
        assert (trial.dir / "logs" / "verifier" / "seen.txt").read_text() == "test.sh\ntest_x.py\n"
        with pytest.raises(SandboxError, match="agent phase is over"):
            trial.exec("true")
    result = json.loads((tmp_path / "t" / "result.json").read_text())
    assert result["outcome"] == "ok" and result["n_commands"] == 2


def test_environment_files_env_and_workdir(tmp_path):
    d = write_task_dir(tmp_path, "env", dockerfile="FROM ubuntu:24.04\nWORKDIR /app/work\nENV GREETING=hello\n"
                                                   "COPY data.txt /app/work/data.txt\n",
                       files={"environment/data.txt": "payload\n"},
                       toml='[verifier]\ntimeout_sec = 30\nenv = { VTOKEN = "v1" }\n[solution]\nenv = { STOKEN = "s1" }\n',
                       test_sh='#!/bin/bash\necho "$VTOKEN $GREETING $(pwd)" > /logs/verifier/seen.txt\n'
                               'echo 1 > /logs/verifier/reward.txt\n',
                       solve_sh='#!/bin/bash\necho "$STOKEN" > /app/work/s.txt\n')
    task = load_task(d)
    with Trial(task, tmp_path / "t", TrialConfig(keep="all")) as trial:
        r = trial.exec("pwd; cat data.txt; echo $GREETING $HOME $USER")
        assert r.output == "/app/work\npayload\nhello /home/agent agent\n"
        trial.run_oracle()
        assert (trial.dir / "app" / "work" / "s.txt").read_text() == "s1\n"
        trial.verify()
        assert (trial.dir / "logs" / "verifier" / "seen.txt").read_text() == "v1 hello /app/work\n"


# ------------------------------------------------------------------------------------------------
# terminal


def test_terminal_framing_helpers():
    assert keys_to_bytes("C-c") == b"\x03" and keys_to_bytes("C-d") == b"\x04" and keys_to_bytes("Enter") == b"\r"
    assert keys_to_bytes("Up") == b"\x1b[A" and keys_to_bytes("M-b") == b"\x1bb"
    assert keys_to_bytes("ls -la\n") == b"ls -la\n" and keys_to_bytes("C-cat") == b"C-cat"
    assert clean_terminal_text(b"a\x1b[31mred\x1b[0m\r\nline\r\n10%\r55%\r100%\ndone\x08!\n") == \
        "ared\nline\n100%\ndon!\n"
    text = "h" * 6000 + "MID" + "t" * 6000
    out = limit_output(text, 10000)
    assert out.startswith("h" * 5000) and out.endswith("t" * 5000)
    assert "[... output limited to 10000 bytes; 2003 interior bytes omitted ...]" in out
    assert limit_output("short", 10000) == "short"


# Seconds to poll for the shell's prompt after a command: generous, for a loaded CI host (a fixed
# wait of 2 s was not enough there); waiting returns as soon as the prompt is back.
PROMPT_WAIT = 15.0


def test_terminal_session(tmp_path):
    task = make_task(tmp_path / "tasks")
    with Trial(task, tmp_path / "t", TrialConfig(command_timeout_sec=5)) as trial:
        term = trial.terminal
        assert term.read_new_output() == "agent@sandbox:/app$ "
        # back at the prompt: no idle wait for the full duration (a wait that is not cut short lasts
        # the whole command_timeout_sec of 5 s, to which duration=10 is capped)
        assert trial.send_keys("cd /tmp && export X=42\n", duration=10) < 5
        trial.send_keys("echo $X $(pwd)\n", duration=10)
        assert term.read_new_output() == "cd /tmp && export X=42\nagent@sandbox:/tmp$ echo $X $(pwd)\n42 /tmp\n" \
                                         "agent@sandbox:/tmp$ "
        trial.send_keys("sleep 100\n", duration=0.5)
        assert not term.at_prompt()
        trial.send_keys("C-c", duration=2)
        # the prompt comes back (polled with a generous deadline: a loaded host can take seconds)
        assert term.wait_for_prompt(PROMPT_WAIT) and term.read_new_output().endswith("^C\nagent@sandbox:/tmp$ ")
        trial.send_keys("cat > /app/done.txt << 'EOF'\ndone\nEOF\n", duration=5)
        assert term.wait_for_prompt(PROMPT_WAIT)
        # the keystrokes are echoed as they arrive; bash's continuation prompts follow
        assert term.read_new_output() == "cat > /app/done.txt << 'EOF'\ndone\nEOF\n> > agent@sandbox:/tmp$ "
        trial.send_keys("seq 1 3000\n", duration=5)
        assert term.wait_for_prompt(PROMPT_WAIT)
        out = term.read_new_output()
        assert "interior bytes omitted" in out and out.endswith("2999\n3000\nagent@sandbox:/tmp$ ")
        # capped at command_timeout_sec: the whole 5 s (the wait ends only at its end), and the
        # shell is still in `sleep 100` when it returns (no wall-clock bound on the way back)
        waited = trial.send_keys("sleep 100\n", duration=1000)
        assert waited >= 5 - 1e-6 and not term.at_prompt(), waited
        trial.send_keys("C-c", duration=1)
        assert term.wait_for_prompt(PROMPT_WAIT)
        term.read_new_output()
        trial.send_keys("python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")' 2>&1 | "
                        "tail -1\n", duration=5)
        assert term.wait_for_prompt(PROMPT_WAIT)
        assert "PermissionError" in term.read_new_output()  # seccomp: no input injection, even into its own tty
        trial.send_keys("exit\n", duration=2)
        deadline = time.monotonic() + PROMPT_WAIT
        while term.is_alive() and time.monotonic() < deadline:  # the shell exits (polled, generous deadline)
            time.sleep(0.05)
        with pytest.raises(SandboxError, match="shell exited"):
            trial.send_keys("true\n", duration=1)
        v = trial.verify()
    assert v.reward == 1.0


def test_oracle_transcripts_replay_in_the_terminal(tmp_path):
    """The transcripts an SFT script would imitate solve their tasks when typed into the shell."""
    tasks = {t.path.name: t for t in load_task_set(SHIPPED_TASKS_DIR)}
    for name in ("write-file-003", "py-return-001", "shell-script-000", "py-kata-to-roman"):
        task = tasks[name]
        with Trial(task, tmp_path / name, TrialConfig()) as trial:
            trial.terminal.read_new_output()
            for cmd in load_transcript(task.path):
                trial.send_keys(cmd["keystrokes"], cmd["duration"] + 5)
            out = trial.terminal.read_new_output()
            v = trial.verify()
        assert (v.outcome, v.reward) == (Outcome.OK, 1.0), (name, out, v.details)


@pytest.mark.slow
def test_all_shipped_transcripts_replay_in_the_terminal(tmp_path):
    for task in load_task_set(SHIPPED_TASKS_DIR):
        with Trial(task, tmp_path / task.path.name, TrialConfig()) as trial:
            for cmd in load_transcript(task.path):
                trial.send_keys(cmd["keystrokes"], cmd["duration"] + 5)
            v = trial.verify()
        assert (v.outcome, v.reward) == (Outcome.OK, 1.0), task.name


# ------------------------------------------------------------------------------------------------
# the sanity gate


def _planted_set(root: Path) -> Path:
    """Four good shipped tasks plus an inverted verifier, a broken oracle, a verifier that writes no
    reward for a failure, and a task without an oracle."""
    s = root / "set"
    for name in ("write-file-000", "py-return-002", "shell-count-lines-000", "py-kata-gcd"):
        shutil.copytree(SHIPPED_TASKS_DIR / name, s / name)
    inv = s / "planted-inverted"
    shutil.copytree(SHIPPED_TASKS_DIR / "write-file-001", inv)
    (inv / "task.toml").write_text((inv / "task.toml").read_text().replace("write-file-001", "planted-inverted"))
    # the EXIT-trap bug class: the check's exit status (0 = success) is written as the reward
    _, word, _, path = load_transcript(inv)[0]["keystrokes"].split()
    (inv / "tests" / "test.sh").write_text(f'#!/bin/bash\n[ "$(cat {path})" = "{word}" ]\n'
                                           'echo $? > /logs/verifier/reward.txt\n')
    bro = s / "planted-broken-oracle"
    shutil.copytree(SHIPPED_TASKS_DIR / "py-kata-flatten", bro)
    (bro / "task.toml").write_text((bro / "task.toml").read_text().replace("py-kata-flatten", "planted-broken-oracle"))
    (bro / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'def flatten(x): return x' > /app/solution.py\n")
    write_task_dir(s, "planted-silent", test_sh='#!/bin/bash\n[ -f /app/done.txt ] && echo 1 > /logs/verifier/reward.txt\n')
    write_task_dir(s, "planted-no-oracle", solve_sh=None)
    return s


def test_check_reports_planted_defects(tmp_path):
    tasks = load_task_set(_planted_set(tmp_path))
    checks = {c.task_name: c for c in check_tasks(tasks, concurrency=4)}
    bad = {k for k, c in checks.items() if not c.passed}
    assert bad == {"jaxrl/planted-inverted", "jaxrl/planted-broken-oracle", "test/planted-silent",
                   "test/planted-no-oracle"}
    inv = checks["jaxrl/planted-inverted"]
    assert inv.oracle.reward == 0.0 and inv.empty.reward == 1.0
    assert any("empty agent: reward 1 (ok), expected reward 0 (inverted verifier?)" in p for p in inv.problems)
    bro = checks["jaxrl/planted-broken-oracle"]
    # the verifier ran; the gate quotes how its output ends (pytest's summary of the failed tests)
    assert bro.problems[0].startswith("oracle: reward 0 (ok), expected reward 1; verifier exit "), bro.problems
    assert "its output ends `" in bro.problems[0] and "failed" in bro.problems[0].rsplit("`", 2)[-2], bro.problems
    assert checks["test/planted-silent"].problems[0].startswith("empty agent: reward 0 (reward_missing)")
    assert checks["test/planted-no-oracle"].problems == ["no oracle (solution/solve.sh)"]
    table = format_check_table(list(checks.values()))
    assert "4/8 tasks pass the gate" in table and "planted-inverted" in table and "write-file-000" not in table


def test_gate_says_why_a_verifier_could_not_run(tmp_path):
    """Issue 28: verifiers that fetch their tools at verification time (no network in the sandbox) or
    call a program the environment lacks showed in the gate as a bare 'reward 0 (ok)'."""
    s = tmp_path / "set"
    pay = 'then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; exit 1; fi\n'
    write_task_dir(s, "needs-net", test_sh="#!/bin/bash\nif : < /dev/tcp/pypi.org/443; " + pay)
    write_task_dir(s, "needs-tool", test_sh="#!/bin/bash\nif jaxrl-no-such-tool-uvx pytest /tests; " + pay)
    write_task_dir(s, "fine")
    checks = {c.task_name: c for c in check_tasks(load_task_set(s), concurrency=3)}
    assert checks["test/fine"].passed
    net = checks["test/needs-net"].problems
    assert len(net) == 1 and net[0].startswith("oracle: reward 0 (ok), expected reward 1; verifier exit 1: the "
                                               "verifier needs the network"), net
    assert "pypi.org" in net[0]  # the line of the verifier's output that shows it is quoted
    tool = checks["test/needs-tool"].problems
    assert len(tool) == 1 and ("verifier exit 1: the verifier runs `jaxrl-no-such-tool-uvx`, which the task's "
                               "environment does not have") in tool[0], tool
    table = format_check_table(list(checks.values()))
    assert "1/3 tasks pass the gate" in table and "needs the network" in table


def test_verifier_cause_of_an_offline_pip_install_and_of_a_long_build_error():
    """The fresh-user review: a verifier that pip-installs pytest offline read as a missing module, and a
    failed image build's fix and log path were cut from the gate's table."""
    from jaxrl.envs.harbor.runner import _describe, verifier_cause
    from jaxrl.envs.harbor.trial import TrialResult

    r = TrialResult("t", "t__1", Outcome.OK, 0.0, verifier_exit_code=1,
                    test_output="ERROR: Could not find a version that satisfies the requirement pytest (from versions: "
                                "none)\nERROR: No matching distribution found for pytest\n/usr/bin/python3: No module "
                                "named pytest\n")
    assert verifier_cause(r).startswith("verifier exit 1: the verifier needs the network"), verifier_cause(r)
    err = "task x: the build failed at STEP 3/5: RUN false: exit status 1; " + "y" * 200 + "; fix that step (log: /l.log)"
    d = _describe(TrialResult("t", "t__1", Outcome.SANDBOX_ERROR, 0.0, error=err))
    assert d.endswith("(log: /l.log)") and "STEP 3/5" in d, d


@pytest.mark.parametrize("args,start", [
    (["--base-image", "ubuntu:24.04"], "error: --base-image 'ubuntu:24.04': not NAME=LOCAL. Fix: e.g. --base-image "),
    (["--base-image", "a=b=c"], "error: --base-image 'a=b=c': not NAME=LOCAL."),
    (["--image-cache-dir", "/proc/nope"], "error: --image-cache-dir: /proc/nope cannot be created: /proc is a "),
    (["--build-concurrency", "0"], "error: --build-concurrency 0: must be at least 1. Fix: "),
    (["--image-cache-max-mb", "-5"], "error: --image-cache-max-mb -5: must be a positive number of megabytes. Fix: "),
    (["--base-image", "ubuntu:24.04=a", "--base-image", "ubuntu:24.04=b"],
     "error: --base-image: ubuntu:24.04 is mapped twice (a and b)"),
    (["--pip-mirror", __file__], "error: --pip-mirror"),
    (["--pip-mirror", "/nonexistent/mirror"], "error: --pip-mirror '/nonexistent/mirror': no such folder. Fix: "),
])
def test_image_backend_flags_are_checked_first_in_one_line(args, start, capsys):
    """The fresh-user review: these flags gave an errno line, no flag name, or an error after 'checking ...'.
    In process (`jaxrl.tasks.main`); the command line itself is run by test_cli and
    test_ctrl_c_during_check_is_one_line."""
    from jaxrl import tasks as tasks_cli

    capsys.readouterr()
    code = tasks_cli.main(["check", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(start) and len(err.splitlines()) == 1, err


def test_a_disk_check_that_straddles_the_start_of_verification_is_not_counted(tmp_path):
    """Regression (a CI run: `limits_hit["disk"] == 2` for one crossing): the monitor read the phase "agent",
    verify() then reset the crossing and began, and the stale check counted the same crossing again."""
    import math

    from jaxrl.envs.harbor import SandboxConfig, Trial, TrialConfig

    trial = Trial(make_task(tmp_path / "tasks"), tmp_path / "trial",
                  TrialConfig(sandbox=SandboxConfig(disk_check_interval_sec=0.01)))
    trial._phase, trial._deadline, trial._over_disk = "agent", math.inf, True  # one crossing already counted

    def over_disk(base):  # verify() starts while this check runs (as its lock block does)
        with trial._lock:
            trial._over_disk, trial._phase = False, "verifying"
        trial._stop_monitor.set()
        return "over the disk limit"

    trial.sandbox.over_disk = over_disk
    trial.sandbox.kill_all = lambda *a, **k: None
    trial._watch()
    assert "disk" not in trial._limits_hit, trial._limits_hit


def test_a_pip_mirror_that_is_a_file_names_its_folder(tmp_path):
    """Fresh-user review: a wheel file given as --pip-mirror was told to `pip download -d <that file>`."""
    wheel = tmp_path / "pytest-9.0.3-py3-none-any.whl"
    wheel.write_bytes(b"")
    out = subprocess.run([sys.executable, "-m", "jaxrl.tasks", "check", "--pip-mirror", str(wheel)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert out.returncode == 2 and "a file, not a folder" in out.stderr and f"(e.g. {tmp_path})" in out.stderr, out.stderr


def test_ctrl_c_during_check_is_one_line(tmp_path):
    """Fresh-user review: Ctrl-C during `check` printed a 30-line traceback, after waiting for the running
    trials to end (here the oracle's 600 s sleep: the exit would time out); now they are stopped at once."""
    import signal
    import time

    s = tmp_path / "set"
    write_task_dir(s, "slow", solve_sh="#!/bin/bash\n(exec -a jaxrl-ctrl-c-probe sleep 600)\necho done > /app/done.txt\n",
                   toml='[task]\nname = "test/slow"\n[agent]\ntimeout_sec = 900.0\n[environment]\nallow_internet = false\n')
    # as from a terminal: SIGINT at its default, so Python turns it into KeyboardInterrupt (a test session
    # started in the background of a non-interactive shell inherits SIGINT ignored, and Python keeps that)
    p = subprocess.Popen([sys.executable, "-m", "jaxrl.tasks", "check", str(s)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not processes_with("jaxrl-ctrl-c-probe"):
        time.sleep(0.2)
    assert processes_with("jaxrl-ctrl-c-probe"), "the oracle did not start"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("checking ")]
    assert p.returncode == 130 and len(lines) == 1 and lines[0].startswith("interrupted:"), err
    assert not processes_with("jaxrl-ctrl-c-probe")  # the trial's processes were killed, not left running


def test_an_invalid_task_is_reported_once(tmp_path, capsys):
    """The fresh-user review: `list` printed an invalid task twice (its INVALID row and a log WARNING), and
    `check --skip-invalid` said it twice too; `checking 1 tasks` read wrong."""
    import logging

    from jaxrl import tasks as tasks_cli

    s = tmp_path / "set"
    shutil.copytree(SHIPPED_TASKS_DIR / "write-file-000", s / "write-file-000")
    bad = write_task_dir(s, "bad")
    (bad / "task.toml").write_text("[environment]\ngpus = 2\n")
    logging.getLogger().handlers.clear()
    assert tasks_cli.main(["list", str(s)]) == 1
    cap = capsys.readouterr()
    assert (cap.out + cap.err).count("gpus = 2") == 1, cap.out + cap.err
    tasks_cli.main(["check", str(s), "--skip-invalid", "--task", "write-file-000"])
    cap = capsys.readouterr()
    assert (cap.out + cap.err).count("gpus = 2") == 1 and "checking 1 task from" in cap.err, cap.err


def test_cli(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = lambda *a: subprocess.run([sys.executable, "-m", "jaxrl.tasks", *a], capture_output=True, text=True,
                                    env=env, timeout=300)
    for sub in ([], ["check"], ["list"], ["run-oracle"]):
        assert run(*sub, "--help").returncode == 0
    s = tmp_path / "set"
    shutil.copytree(SHIPPED_TASKS_DIR / "write-file-000", s / "write-file-000")
    inv = write_task_dir(s, "inverted", test_sh="#!/bin/bash\n[ -f /app/done.txt ]\necho $? > /logs/verifier/reward.txt\n")
    p = run("check", str(s), "--json", str(tmp_path / "check.json"), "--concurrency", "4")
    assert p.returncode == 1, p.stderr
    assert "test/inverted" in p.stdout and "inverted verifier?" in p.stdout and "1/2" in p.stdout
    assert "write-file-000" not in p.stdout
    rows = json.loads((tmp_path / "check.json").read_text())
    assert [r["passed"] for r in rows] == [True, False]
    p = run("check", str(s), "--task", "write-file-000", "--all")
    assert p.returncode == 0 and "1/1 tasks pass" in p.stdout and "write-file-000" in p.stdout, p.stdout + p.stderr
    p = run("list", str(s))
    assert p.returncode == 0 and "test/inverted" in p.stdout and "shell" in p.stdout
    p = run("run-oracle", str(s), "--task", "write-file-000", "--trials-dir", str(tmp_path / "runs"))
    assert p.returncode == 0 and '"reward": 1.0' in p.stdout and '"outcome": "ok"' in p.stdout
    from jaxrl.envs.harbor import write_parquet

    write_parquet([s / "write-file-000"], tmp_path / "one.parquet")
    p = run("list", str(tmp_path / "one.parquet"), "--extract-dir", str(tmp_path / "unpacked"))
    assert p.returncode == 0 and "write-file-000" in p.stdout and (tmp_path / "unpacked" / "write-file-000").is_dir()
    p = run("check", str(tmp_path / "nope"))
    assert p.returncode == 2 and p.stderr.strip().startswith("error:") and len(p.stderr.strip().splitlines()) == 1
    os.remove(inv / "tests" / "test.sh")
    p = run("check", str(s))
    assert p.returncode == 2 and "missing tests/test.sh" in p.stderr


@pytest.mark.slow
def test_check_whole_shipped_set():
    checks = check_tasks(load_task_set(SHIPPED_TASKS_DIR))
    assert all(c.passed for c in checks), format_check_table(checks)


# ------------------------------------------------------------------------------------------------
# concurrency


def test_trials_run_concurrently_and_a_hung_trial_does_not_stall_the_rest(tmp_path, monkeypatch):
    """Deterministic (was `wall < 12 s`): the 6 quick agents meet at a barrier, which only
    agents running at once can pass (run one after another, the first would break it and fail its
    trial); the agent stuck in Python is still stuck when run_trials returns (its trial ended at
    its 2 s budget and 1 s grace), and ends only when the test releases it."""
    import threading

    monkeypatch.setattr(runner_mod, "AGENT_GRACE_SEC", 1.0)
    task = make_task(tmp_path / "tasks")
    slow_task = make_task(tmp_path / "tasks", "slow", toml='[agent]\ntimeout_sec = 2\n[verifier]\ntimeout_sec = 30\n')
    together = threading.Barrier(6, timeout=120)
    release, stuck_ended = threading.Event(), []

    def quick(trial):
        together.wait()  # BrokenBarrierError (the trial fails) unless all 6 agents run at once
        trial.exec("echo done > /app/done.txt")

    def hung(trial):
        trial.exec("sleep 1000", timeout=1000)

    def stuck_in_python(trial):
        stuck_ended.append(release.wait(1000))

    jobs = [(task, quick)] * 6 + [(slow_task, hung), (slow_task, stuck_in_python)]
    finished = []
    results = run_trials(jobs, concurrency=8, trials_dir=tmp_path / "trials",
                         on_result=lambda r: finished.append(r.trial_name))
    assert stuck_ended == []  # run_trials did not wait for the stuck agent
    release.set()
    assert [r.outcome for r in results] == [Outcome.OK] * 6 + [Outcome.AGENT_TIMEOUT] * 2
    assert [r.reward for r in results] == [1.0] * 6 + [0.0] * 2
    assert len(finished) == 8
    deadline = time.monotonic() + 30  # polled: the released agent's thread ends
    while not stuck_ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stuck_ended == [True]
    results = asyncio.run(arun_trials([(task, None), (task, oracle_agent)], concurrency=2))
    assert [r.reward for r in results] == [0.0, 1.0]
    with pytest.raises(ValueError, match="concurrency"):
        run_trials([(task, None)], concurrency=0)


def test_trial_result_row(tmp_path):
    task = make_task(tmp_path / "tasks")
    r = run_trial(task, oracle_agent, config=TrialConfig(keep="none"), trial_dir=tmp_path / "t")
    row = r.to_row()
    assert list(row)[:7] == ["task_name", "trial_name", "outcome", "reward", "agent_duration_sec",
                             "verifier_duration_sec", "n_commands"]
    assert row["outcome"] == "ok" and row["reward"] == 1.0 and row["n_commands"] == 1
    assert {k for k in row if k.startswith("limit_")} == {"limit_timeout", "limit_memory", "limit_pids",
                                                          "limit_file_size", "limit_cpu_time", "limit_disk"}
    assert not (tmp_path / "t").exists()  # keep="none"


def test_unsafe_host_backend_is_explicit(tmp_path):
    """Without isolation: only when asked for by name; then /app etc. are links on this host."""
    task = load_task(SHIPPED_TASKS_DIR / "write-file-002")
    cfg = TrialConfig(sandbox=SandboxConfig(backend=UNSAFE_HOST_BACKEND))
    if os.geteuid() == 0 and not os.path.exists("/app"):
        r1 = run_trial(task, oracle_agent, config=cfg, trial_dir=tmp_path / "a")
        r0 = run_trial(task, empty_agent, config=cfg, trial_dir=tmp_path / "b")
        assert (r1.reward, r0.reward) == (1.0, 0.0)
        assert not os.path.lexists("/app") and not os.path.lexists("/logs")
    else:
        r = run_trial(task, oracle_agent, config=cfg, trial_dir=tmp_path / "a")
        assert r.outcome == Outcome.SANDBOX_ERROR and UNSAFE_HOST_BACKEND in r.error
    with pytest.raises(ValueError, match="WITHOUT isolation"):
        SandboxConfig(backend="none").validate()


@pytest.mark.parametrize("reset", ["env", "preexec_fn"])
def test_ctrl_c_works_when_the_host_process_ignores_and_blocks_sigint(tmp_path, monkeypatch, reset):
    """Regression: a child inherits ignored signals and the blocked mask of the thread that forks
    it, and an interactive bash cannot undo an ignored SIGINT. Started from a process ignoring or
    blocking SIGINT (the test session did, after earlier tests), the agent's Ctrl-C never stopped
    `sleep` in the trial's shell. Trial processes now start with default signals and an empty mask:
    through ``env --default-signal`` (no Python code between fork and exec), or on hosts whose env
    lacks that option through a `preexec_fn` (forced here with reset="preexec_fn")."""
    from jaxrl.envs.harbor import spawn as spawn_mod

    if reset == "env":
        assert spawn_mod._env_resets_signals(), "this host's env has no --default-signal (coreutils < 8.31)"
        assert spawn_mod._signal_kwargs() == {}
        assert spawn_mod._with_default_signals(["x"]) == ["/usr/bin/env", "--default-signal", "x"]
    else:
        monkeypatch.setattr(spawn_mod, "_env_resets_signals", lambda: False)
        assert spawn_mod._with_default_signals(["x"]) == ["x"]
    old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    try:
        task = make_task(tmp_path / "tasks")
        with Trial(task, tmp_path / "t", TrialConfig(command_timeout_sec=5)) as trial:
            term = trial.terminal
            term.read_new_output()
            trial.send_keys("sleep 100\n", duration=0.5)
            assert not term.at_prompt()
            trial.send_keys("C-c", duration=2)
            assert term.wait_for_prompt(PROMPT_WAIT) and term.read_new_output().endswith("^C\nagent@sandbox:/app$ ")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        signal.signal(signal.SIGINT, old_handler)
