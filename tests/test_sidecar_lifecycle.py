"""Regression tests: split requests get distinct seeds; a trainer-owned sidecar dies with its parent."""
import os
import subprocess
import sys
import time

from jaxrl.rollout.wire import chunk_params
from jaxrl.rollout.types import SamplingParams


def test_chunks_of_a_split_request_get_distinct_derived_seeds():
    p = SamplingParams(seed=5)
    seeds = [chunk_params(p, i).seed for i in range(4)]
    assert seeds == [(5 * 1_000_003 + 7919 * (i + 1)) % 2**31 for i in range(4)]
    assert len(set(seeds)) == 4 and 5 not in seeds
    assert chunk_params(SamplingParams(seed=None), 3).seed is None


def test_exit_with_parent_ends_the_child_when_the_parent_is_killed():
    # The child says when its watchdog runs (on the stdout it shares with the parent), so the parent
    # is killed after that, not after a fixed sleep.
    child_code = ("import time; from jaxrl.rollout.process import exit_with_parent; "
                  "exit_with_parent(); print('watching', flush=True); time.sleep(60)")
    parent_code = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {child_code!r}], "
                   "start_new_session=True); print(c.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "watching"
    os.kill(child_pid, 0)  # alive while the parent lives
    parent.kill()  # SIGKILL: the parent cannot clean up
    parent.wait()
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        # reap if it became our zombie (it is not our child, so this only polls)
        time.sleep(0.2)
    raise AssertionError(f"child {child_pid} still alive 15 s after its parent was killed")
