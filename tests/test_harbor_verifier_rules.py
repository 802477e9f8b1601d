"""Episode ends and rewards as Harbor 0.26 defines them, through `python -m jaxrl.tasks check` (the
oracle and the empty agent in real sandboxed trials) on tasks whose verifiers write both reward
files, write no reward file on failure, or need a process the agent (oracle) started. The expected
reward and error class of each follow Harbor's rules (reward.json before reward.txt; no reward file
= RewardFileNotFoundError; the agent's processes live through verification), computed here by hand
from the task's own logic."""
from __future__ import annotations

import json
import subprocess
import sys

from harbor_helpers import make_task, write_task_dir
from jaxrl.envs.harbor import Outcome, Trial, TrialConfig

BOTH_TEST = ('#!/bin/bash\nif [ "$(cat /app/done.txt 2>/dev/null)" = done ]; then\n'
             '  echo \'{"reward": 1}\' > /logs/verifier/reward.json; echo 0 > /logs/verifier/reward.txt\n'
             'else\n  echo \'{"reward": 0}\' > /logs/verifier/reward.json; echo 1 > /logs/verifier/reward.txt\nfi\n')
NONE_ON_FAIL_TEST = ('#!/bin/bash\nif [ "$(cat /app/done.txt 2>/dev/null)" = done ]; then '
                     'echo 1 > /logs/verifier/reward.txt; fi\n')
# pays 1 only if a process the agent (oracle) started is still alive while the verifier runs: the process holds
# an flock on /app/alive.lock (taken before /app/held is written), so `flock -n` fails exactly while it lives;
# no sleep decides the outcome
PROCESS_TEST = ('#!/bin/bash\nif [ -e /app/held ] && ! flock -n /app/alive.lock true; then '
                'echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
HOLD_LOCK = "flock /app/alive.lock sh -c 'touch /app/held; exec sleep infinity' > /dev/null 2>&1 &"
WAIT_HELD = "until [ -e /app/held ]; do sleep 0.05; done"  # a poll: the solution ends once the lock is held
PROCESS_SOLVE = f"#!/bin/bash\n{HOLD_LOCK}\n{WAIT_HELD}\n"


def _check(root, *extra):
    out = root / "check.json"
    r = subprocess.run([sys.executable, "-m", "jaxrl.tasks", "check", str(root / "tasks"), "--all", "--json",
                        str(out), "--concurrency", "2", *extra], capture_output=True, text=True, timeout=600)
    return r, {c["task"]: c for c in json.loads(out.read_text())}


def test_tasks_check_gives_harbors_rewards_and_error_classes(tmp_path):
    tasks = tmp_path / "tasks"
    write_task_dir(tasks, "both-files", test_sh=BOTH_TEST)
    write_task_dir(tasks, "no-reward-file", test_sh=NONE_ON_FAIL_TEST)
    write_task_dir(tasks, "needs-process", test_sh=PROCESS_TEST, solve_sh=PROCESS_SOLVE)
    r, res = _check(tmp_path)
    assert r.returncode == 1, r.stderr  # no-reward-file fails the gate
    # both files: reward.json decides (oracle 1, empty 0), so the gate passes
    assert res["test/both-files"]["passed"], res["test/both-files"]
    # no reward file for the empty agent: reward 0 with the error class, not a plain 0
    assert not res["test/no-reward-file"]["passed"]
    assert any("reward_missing" in p for p in res["test/no-reward-file"]["problems"])
    # the oracle's background process is alive while the verifier watches it
    assert res["test/needs-process"]["passed"], res["test/needs-process"]
    table = r.stdout
    assert "1 ok" in table and "0 reward_missing" in table
    # with the agent's processes stopped first, the process task can no longer pass
    r2, res2 = _check(tmp_path, "--stop-agent-processes", "--task", "test/needs-process")
    assert r2.returncode == 1 and not res2["test/needs-process"]["passed"]


def test_terminal_background_job_lives_through_verification(tmp_path):
    task = make_task(tmp_path, "t", test_sh=PROCESS_TEST)
    for stop, reward in ((False, 1.0), (True, 0.0)):
        trial = Trial(task, tmp_path / f"trial-{stop}", TrialConfig(keep="none", stop_agent_processes=stop)).start()
        try:
            trial.terminal.read_new_output()
            trial.send_keys(f"{HOLD_LOCK} {WAIT_HELD}\n", 60.0)  # one line: back at the prompt once held
            v = trial.verify()
        finally:
            trial.close()
        assert (v.outcome, v.reward) == (Outcome.OK, reward), (stop, v.details)
