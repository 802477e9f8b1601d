"""launch/slurm_job.sh on a cluster emulated on this machine (tests/fake_slurm: sbatch, srun and
scontrol stand-ins; "nodes" are process groups bound to loopback addresses 127.0.0.1, .2, .3).

The real job script runs under `sbatch --wait`: argument handling, node roles, engine addresses,
the shared token, the jax.distributed coordinator, restarts and clean stops. The trainer nodes are
JAX processes with 4 fake CPU devices each, the rollout node runs JAX sidecars in place of vLLM,
and the policy is the tiny embedded one.
"""
import csv
import os
import re
import socket
import stat
import subprocess
import sys

import pytest

from tests.fake_slurm import fakeslurm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_BIN = os.path.join(ROOT, "tests", "fake_slurm")
NODES = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
# Tiny run: 4 prompts x 4 samples, one optimizer step per RL step, 4 held-out prompts at the end.
TINY = ["--config.trainer.train_batch_size=4", "--config.trainer.mini_batch_size=4",
        "--config.trainer.micro_batch_size=16", "--config.generator.n_samples_per_prompt=4",
        "--config.data.num_eval_prompts=4", "--config.trainer.eval_before_train=False",
        "--config.trainer.eval_interval=0", "--config.trainer.export_best=False"]


def _free_ports(k: int) -> int:
    """A base port P with P .. P+k-1 free on every fake node's address."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + k > 65535:
            continue
        try:
            for port in range(base, base + k):
                for host in NODES:
                    with socket.socket() as t:
                        t.bind((host, port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "XLA_FLAGS", "JAXRL_", "FAKE_SLURM"))}
    env.update(PATH=os.pathsep.join([FAKE_BIN, os.path.dirname(sys.executable), env.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH", "")])),
               FAKE_SLURM_STATE=str(tmp_path / "slurm"), FAKE_SLURM_NODES=",".join(NODES),
               FAKE_SLURM_KILL_WAIT="5", JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def _sbatch(tmp_path, nodes, job_args, env=None, timeout=400):
    """`sbatch --wait --nodes=N launch/slurm_job.sh ...` from the repo root; returns (rc, job output)."""
    out = tmp_path / f"job{len(list(tmp_path.glob('job*.out')))}.out"
    cmd = ["sbatch", "--wait", f"--nodes={nodes}", f"--output={out}", "launch/slurm_job.sh", *job_args]
    env = env or _env(tmp_path)
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    text = out.read_text() if out.exists() else ""
    return r.returncode, text + r.stdout + r.stderr


def _job_dirs(tmp_path):
    return sorted((tmp_path / "slurm").glob("job_*"))


def _notes(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("slurm_job.sh", "rollout_node.sh"))]


# ---------------------------------------------------------------------------------------------
# The fake SLURM itself
# ---------------------------------------------------------------------------------------------

def test_fake_hostlists_follow_slurm_syntax():
    assert fakeslurm.expand_hostlist("jpbo-[001-003],login7") == ["jpbo-001", "jpbo-002", "jpbo-003", "login7"]
    assert fakeslurm.expand_hostlist("n[1,3-4]") == ["n1", "n3", "n4"]
    assert fakeslurm.expand_hostlist("127.0.0.[1-3]") == NODES
    assert fakeslurm.compress_hostlist(NODES) == "127.0.0.[1-3]"
    assert fakeslurm.compress_hostlist(["n1", "n2", "n4", "x"]) == "n[1-2,4],x"
    names = ["jpbo-009", "jpbo-010", "jpbo-011"]
    assert fakeslurm.expand_hostlist(fakeslurm.compress_hostlist(names)) == names


# ---------------------------------------------------------------------------------------------
# Argument handling: one-line errors before anything starts
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nodes, args, message", [
    (2, ["--train-nodes=2", "--engine=jax", "W"], "at least one node must run rollout engines"),
    (2, ["--engine=vllm", "W"], "--engine=vllm needs --model=DIR"),
    (2, ["--engine=jax", "--engine-tp=3", "W"], "--engine-tp=3 must divide --gpus-per-node=4"),
    (2, ["--engine=jax", "--engine-restarts=x", "W"], "--engine-restarts=x is not a non-negative integer"),
    (2, ["--engine=vllm", "--engine-restarts=1", "W"], "needs --engine=jax"),
    (2, ["--engine=jax", "--train-nodes", "W"], "option --train-nodes needs a value"),
    (2, ["--engine=jax", "--frobnicate=1", "W"], "unknown option --frobnicate"),
    (2, ["--engine=jax", "W", "--config.generator.sidecar_urls=('http://x:1',)"], "is set by this script"),
    (2, ["--engine=jax", "W", "stray"], "unexpected argument stray after WORKDIR"),
    (2, ["--engine=jax"], "usage: sbatch --nodes=N"),
])
def test_job_script_rejects_bad_arguments(tmp_path, nodes, args, message):
    args = [str(tmp_path / "run") if a == "W" else a for a in args]
    rc, out = _sbatch(tmp_path, nodes, args, timeout=60)
    assert rc == 2, out
    errors = [line for line in out.splitlines() if line.startswith("slurm_job.sh: error:")]
    assert len(errors) == 1 and message in errors[0], out
    assert not (tmp_path / "run").exists()  # nothing was created
    assert not list((_job_dirs(tmp_path)[0] / "steps").iterdir())  # no step was started


# ---------------------------------------------------------------------------------------------
# A whole run: 2 training nodes x 4 devices, 1 rollout node with 2 engines
# ---------------------------------------------------------------------------------------------

def test_job_trains_with_two_trainer_nodes_and_remote_jax_engines(tmp_path):
    port, coord = _free_ports(2), _free_ports(3)
    wd = tmp_path / "run"
    rc, out = _sbatch(tmp_path, 3, [
        "--train-nodes=2", "--engine=jax", "--engine-tp=2", "--platform=cpu", f"--port={port}",
        f"--coordinator-port={coord}", "--recipe=configs/rloo.py", "--engine-args=--log-level info", str(wd),
        # The mesh needs 8 devices: only 2 processes x 4 devices joined by the coordinator give them.
        "--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.trainer.num_steps=2", *TINY])
    assert rc == 0, out[-5000:]
    notes = _notes(out)
    assert any("trainer on 127.0.0.1 127.0.0.2 (8 devices, coordinator 127.0.0.1:" f"{coord})" in n for n in notes), notes
    urls = [f"http://127.0.0.3:{port}", f"http://127.0.0.3:{port + 1}"]
    # Engine e of the rollout node gets GPUs [2e, 2e+2) (tensor parallel 2 on a 4-GPU node) and port P + e.
    assert any(f"engine 0 on {urls[0]} (GPUs 0,1)" in n for n in notes), notes
    assert any(f"engine 1 on {urls[1]} (GPUs 2,3)" in n for n in notes), notes
    assert "training finished" in notes[-1], notes
    job = _job_dirs(tmp_path)[0]
    assert (wd / "logs" / f"engines.{job.name[4:]}.txt").read_text().split() == urls
    token = wd / ".sidecar_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text().strip()) == 64
    # Each engine bound its node's address, served rollouts and loaded every published version
    # (the weight-load endpoint answers 200 only to the shared token).
    for u in urls:
        log = (wd / "logs" / f"engine_127.0.0.3_{u.rsplit(':', 1)[1]}.log").read_text()
        assert f"Uvicorn running on {u}" in log
        assert re.search(r'"POST /v1/completions HTTP/1.1" 200', log), log[-2000:]
        loads = re.findall(r'"POST /v1/load_weights HTTP/1.1" (\d+)', log)
        assert loads == ["200"] * 3, loads  # version 0 at start, then one per RL step
    with open(wd / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["1", "2"]
    assert all(float(r["trainer/policy_version"]) == int(r["step"]) for r in rows)
    assert rows[-1]["eval/success_rate"] != ""
    assert (wd / "summary.json").exists() and (wd / "checkpoints").is_dir()
    # The script stopped its engines itself: nothing was left for the end of the job to kill.
    assert not (job / "leftover_steps.txt").exists()
    assert not list((job / "steps").iterdir())


# ---------------------------------------------------------------------------------------------
# Failures: restarts, then a clean stop with a message; resubmission resumes
# ---------------------------------------------------------------------------------------------

def test_engine_that_keeps_dying_stops_the_job(tmp_path):
    port, coord = _free_ports(4), _free_ports(1)
    wd = tmp_path / "run"
    rc, out = _sbatch(tmp_path, 2, [
        "--train-nodes=1", "--engine=jax", "--platform=cpu", f"--port={port}", f"--coordinator-port={coord}",
        "--engine-tp=4", "--engine-restarts=1", "--recipe=configs/rloo.py", "--engine-args=--no-such-flag", str(wd)], timeout=120)
    assert rc == 1, out[-3000:]
    notes = _notes(out)
    assert any("engine 0 (http://127.0.0.2:" f"{port}) exited with code 2; restarting it (1 of 1)" in n
               for n in notes), notes
    assert any("has no restarts left (--engine-restarts=1)" in n for n in notes), notes
    assert "unrecognized arguments: --no-such-flag" in out  # the log tail of the failed engine
    assert any("rollout role failed" in n for n in notes) and "resubmit the same command" in notes[-1], notes
    job = _job_dirs(tmp_path)[0]
    assert not (job / "leftover_steps.txt").exists()
    assert not (wd / "rl_config.json").exists()  # the trainer never started


def test_trainer_restarts_then_job_stops_and_resubmission_is_accepted(tmp_path):
    """The trainer SIGKILLs itself after its first rollouts (JAXRL_KILL_AT), each time: the job
    restarts it once, then stops every role with a message. Resubmitting the same run with engines
    on other ports (new URLs, as on other nodes) passes the resume check and trains."""
    port, coord = _free_ports(1), _free_ports(2)
    wd = tmp_path / "run"
    common = ["--train-nodes=1", "--engine=jax", "--engine-tp=4", "--platform=cpu", "--recipe=configs/rloo.py"]
    overrides = ["--config.trainer.num_steps=1", *TINY]
    rc, out = _sbatch(tmp_path, 2, [*common, f"--port={port}", f"--coordinator-port={coord}",
                                    "--trainer-restarts=1", str(wd), *overrides],
                      env=_env(tmp_path, JAXRL_KILL_AT="generate:1"))
    assert rc == 1, out[-5000:]
    notes = _notes(out)
    assert any("trainer exited with code 137; restarting it (1 of 1)" in n for n in notes), notes
    assert any("trainer failed (exit code 137) and has no restarts left (--trainer-restarts=1)" in n
               for n in notes), notes
    assert "resubmit the same command" in notes[-1], notes
    first_job = _job_dirs(tmp_path)[0]
    assert not (first_job / "leftover_steps.txt").exists()

    port2, coord2 = _free_ports(1), _free_ports(1)
    assert port2 != port
    rc, out = _sbatch(tmp_path, 2, [*common, f"--port={port2}", f"--coordinator-port={coord2}", str(wd), *overrides])
    assert rc == 0, out[-5000:]
    with open(wd / "metrics.csv") as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["1"]
    assert f"http://127.0.0.2:{port2}" in (wd / "rl_config.json").read_text()
