"""One run per workdir: trainer process 0 holds an exclusive lock on WORKDIR/.lock for the run's
life (jaxrl/train/rundir.py:WorkdirLock), so a second `python -m jaxrl.main --workdir=D` stops in
seconds with one line naming D, the holder's PID and the fix; the lock dies with its process
(kill -9, then a resume, works: tests/test_trainer.py's kill tests run the whole cycle); the other
processes of a multi-host job take no lock (tests/test_launch.py and test_trainer.py's two-process
run share one workdir between two trainer processes)."""
import os
import signal
import subprocess
import sys

import pytest

from jaxrl.train import rundir
from jaxrl.train.rundir import RunDirError, WorkdirLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_KILL_AT")},
       "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}

HOLDER = """
import sys, time
from jaxrl.train.rundir import WorkdirLock
WorkdirLock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/wd (killed with SIGKILL at the end)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(wd)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    yield p, str(wd)
    if p.poll() is None:
        p.kill()
        p.wait()


def test_a_held_workdir_is_refused_naming_it_the_holder_and_the_fix(holder):
    p, wd = holder
    with pytest.raises(RunDirError) as e:
        WorkdirLock.acquire(wd)
    msg = str(e.value)
    assert f"the workdir {wd} is in use by another run (PID {p.pid} on host " in msg, msg
    assert "Fix: wait until that run ends (or stop it), or pass another --workdir" in msg, msg
    assert "\n" not in msg


def test_the_lock_dies_with_a_killed_holder(holder):
    """kill -9 of the running trainer leaves no stale lock: the resumed run gets it at once."""
    p, wd = holder
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    lock = WorkdirLock.acquire(wd)
    try:
        with open(os.path.join(wd, ".lock")) as f:
            assert f.read().startswith(f"PID {os.getpid()} on host ")
    finally:
        lock.release()


def test_one_process_may_reopen_its_own_workdir_and_the_last_release_unlocks(tmp_path):
    wd = str(tmp_path)
    a = WorkdirLock.acquire(wd)
    # Not passed to child processes (sidecars, sandboxes): a child left running after a kill -9 of
    # the trainer would otherwise keep the workdir locked.
    assert not os.get_inheritable(WorkdirLock._held[a.path][0])
    b = WorkdirLock.acquire(wd)  # the same process again (tests build several trainers on one workdir)
    a.release()
    a.release()  # idempotent: does not drop b's hold
    probe = [sys.executable, "-c", "import sys; from jaxrl.train.rundir import WorkdirLock; "
             "WorkdirLock.acquire(sys.argv[1])", wd]
    out = subprocess.run(probe, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "is in use by another run" in out.stderr, out.stderr[-2000:]
    b.release()
    assert a.path not in rundir.WorkdirLock._held  # other tests of this worker process may hold other workdirs
    out = subprocess.run(probe, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.fixture
def model_loads(monkeypatch):
    """The model folders whose config is read (`Qwen3Config.from_pretrained`, the trainer's first load)."""
    from jaxrl.models import qwen3

    loaded = []
    real = qwen3.Qwen3Config.from_pretrained.__func__
    monkeypatch.setattr(qwen3.Qwen3Config, "from_pretrained",
                        classmethod(lambda cls, path, *a, **k: loaded.append(path) or real(cls, path, *a, **k)))
    return loaded


def test_a_second_main_job_on_a_busy_workdir_stops_at_once_with_one_line(holder, model_loads, monkeypatch, capsys):
    """Two `python -m jaxrl.main --workdir=D` at once used to write one run directory together.
    jaxrl.main's `main` in this process (tests/main_in_process.py) against the holder process: it
    stops before loading anything, i.e. before the model's config is read (recorded here; the test
    had a wall-clock bound, 120 s, instead)."""
    from main_in_process import recipe, run_main

    p, wd = holder
    code, err = run_main(monkeypatch, capsys, recipe("configs/rloo.py", **{"trainer.num_steps": 1}), wd)
    err = err.strip()
    assert code == 2, err[-3000:]
    assert err.startswith(f"error: the workdir {wd} is in use by another run (PID {p.pid} on host "), err
    assert len(err.splitlines()) == 1 and "or pass another --workdir" in err, err
    assert sorted(os.listdir(wd)) == [".lock"]  # nothing of the run was written
    assert model_loads == []  # stopped before loading the model (the next test sees a trainer load it)


def test_only_trainer_process_0_takes_the_lock(holder, model_loads, monkeypatch):
    """In a multi-host job every process shares the workdir; processes other than 0 take no lock
    (here: a process that believes it is process 1 builds its trainer on a workdir another
    process holds)."""
    import jax

    from jaxrl.config import base_config
    from jaxrl.train import trainer

    _, wd = holder
    c = base_config()
    c.trainer.num_steps = 1
    monkeypatch.setattr(jax, "process_index", lambda *a: 1)
    t = trainer.Trainer(c, wd, progress=False)
    try:
        assert t.workdir_lock is None and not t.is_main
        assert model_loads  # the record the test above finds empty
    finally:
        t.ckpt.close()
        t.close()
