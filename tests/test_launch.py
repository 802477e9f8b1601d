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


def _ports(engines: int, coordinators: int) -> tuple[int, int]:
    """(engine base port, coordinator base port): one free range, so the two never overlap."""
    base = _free_ports(engines + coordinators)
    return base, base + engines


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
    (2, ["--engine=jax", "W", "--config.model.path=/ckpt"], "give the checkpoint as --model=DIR instead"),
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
    port, coord = _ports(2, 3)
    wd = tmp_path / "run"
    rc, out = _sbatch(tmp_path, 3, [
        "--train-nodes=2", "--engine=jax", "--engine-tp=2", "--platform=cpu", f"--port={port}",
        f"--coordinator-port={coord}", "--recipe=configs/rloo.py", "--engine-args=--log-level info", str(wd),
        # The mesh needs 8 devices: only 2 processes x 4 devices joined by the coordinator give them.
        "--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.trainer.num_steps=1", *TINY])
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
        assert loads == ["200"] * 2, loads  # version 0 at start, then one per RL step (one step)
    with open(wd / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["1"]
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
    port, coord = _ports(4, 1)
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


def test_trainer_restarts_then_job_stops_cleanly(tmp_path):
    """The trainer SIGKILLs itself after its first rollouts (JAXRL_KILL_AT), each time: the job
    restarts it once, then stops every role with a message and an exit code of 1."""
    port, coord = _ports(1, 2)
    wd = tmp_path / "run"
    rc, out = _sbatch(tmp_path, 2, [
        "--train-nodes=1", "--engine=jax", "--engine-tp=4", "--platform=cpu", "--recipe=configs/rloo.py",
        f"--port={port}", f"--coordinator-port={coord}", "--trainer-restarts=1", str(wd),
        "--config.trainer.num_steps=1", *TINY], env=_env(tmp_path, JAXRL_KILL_AT="generate:1"))
    assert rc == 1, out[-5000:]
    notes = _notes(out)
    assert any("trainer exited with code 137; restarting it (1 of 1)" in n for n in notes), notes
    assert any("trainer failed (exit code 137) and has no restarts left (--trainer-restarts=1)" in n
               for n in notes), notes
    assert "resubmit the same command" in notes[-1], notes
    # Both attempts got rollouts from the engine before dying; the engine was stopped by the script.
    log = (wd / "logs" / f"engine_127.0.0.2_{port}.log").read_text()
    assert len(re.findall(r'"POST /v1/completions HTTP/1.1" 200', log)) >= 2, log[-2000:]
    job = _job_dirs(tmp_path)[0]
    assert not (job / "leftover_steps.txt").exists()
    assert not list((job / "steps").iterdir())


def test_resubmitted_job_may_have_engines_at_other_urls(tmp_path):
    """Regression: a resubmitted job gets other rollout nodes, so generator.sidecar_urls differs
    from the run's rl_config.json; the trainer refused to resume ("different config"). Other
    keys still must match."""
    import ml_collections

    from jaxrl.config import ConfigError
    from jaxrl.train import trainer

    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import rloo

    def config(urls, lr=1e-4):
        c = rloo.get_config()
        c.generator.sidecar_urls = urls
        c.trainer.optimizer.lr = lr
        return ml_collections.ConfigDict(c)

    wd = str(tmp_path / "run")
    trainer.Trainer(config(("http://n7:8100", "http://n7:8101")), wd, progress=False).close()
    t = trainer.Trainer(config(("http://n9:8100", "http://n9:8101")), wd, progress=False)
    t.close()
    assert "http://n9:8100" in open(os.path.join(wd, "rl_config.json")).read()
    with pytest.raises(ConfigError, match="trainer.optimizer.lr"):
        trainer.Trainer(config(("http://n9:8100",), lr=2e-4), wd, progress=False)
    # Closed trainers and the refused one leave the workdir unlocked (a lock leaked here once made
    # a later test of the same worker process fail).
    from jaxrl.train.rundir import WorkdirLock
    assert os.path.realpath(os.path.join(wd, ".lock")) not in WorkdirLock._held


# ---------------------------------------------------------------------------------------------
# The vLLM path and the split-job trainer script, with stand-ins for `vllm` and the trainer
# ---------------------------------------------------------------------------------------------

STUB_TRAINER = r'''#!/usr/bin/env python3
"""Stand-in for `python -m jaxrl.main`: records its arguments and environment, exits 0."""
import json, os, sys
keys = ("JAXRL_COORDINATOR_ADDRESS", "JAXRL_NUM_PROCESSES", "JAXRL_PROCESS_ID", "SLURMD_NODENAME", "XLA_FLAGS")
rec = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}
with open(os.path.join(os.environ["STUB_OUT"], f"trainer_{os.environ['SLURM_PROCID']}.json"), "w") as f:
    json.dump(rec, f)
if os.environ.get("STUB_TRAINER_SLEEP"):  # a trainer that trains until stopped
    import time
    time.sleep(float(os.environ["STUB_TRAINER_SLEEP"]))
'''

STUB_VLLM = r'''#!/usr/bin/env python3
"""Stand-in for `vllm serve`: records its arguments and environment, answers GET /health."""
import http.server, json, os, sys
args = sys.argv[1:]
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
keys = ("CUDA_VISIBLE_DEVICES", "VLLM_API_KEY", "JAXRL_SYNC_DIR", "VLLM_SERVER_DEV_MODE", "SLURMD_NODENAME")
with open(os.path.join(os.environ["STUB_OUT"], f"vllm_{host}_{port}.json"), "w") as f:
    json.dump({"argv": args, "env": {k: os.environ.get(k) for k in keys}}, f)

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *a):
        pass

server = http.server.HTTPServer((host, port), H)
if os.environ.get("STUB_VLLM_EXIT_WHEN"):  # an engine that crashes once this file exists (the trainer runs)
    import threading, time
    def crash(path=os.environ["STUB_VLLM_EXIT_WHEN"]):
        while not os.path.exists(path):
            time.sleep(0.1)
        os._exit(3)
    threading.Thread(target=crash, daemon=True).start()
server.serve_forever()
'''


def _stubs(tmp_path):
    stub_dir, out = tmp_path / "stubs", tmp_path / "stub_out"
    stub_dir.mkdir()
    out.mkdir()
    for name, text in (("python", STUB_TRAINER), ("vllm", STUB_VLLM)):
        (stub_dir / name).write_text(text)
        (stub_dir / name).chmod(0o755)
    env = _env(tmp_path, STUB_OUT=str(out))
    env["PATH"] = os.pathsep.join([FAKE_BIN, str(stub_dir), os.path.dirname(sys.executable), os.environ["PATH"]])
    return env, out


def test_vllm_layout_engines_per_gpu_group_and_trainer_arguments(tmp_path):
    """3 nodes of 4 GPUs, 1 trainer node, tensor parallel 2: 2 vLLM engines on each of 2 rollout
    nodes, each with its own 2 GPUs, port and the node's address; the trainer gets all 4 URLs."""
    import json

    env, out = _stubs(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "prompts.jsonl"
    data.write_text("")
    port, coord = _ports(2, 1)
    wd = tmp_path / "run"
    rc, text = _sbatch(tmp_path, 3, [
        "--train-nodes=1", "--engine-tp=2", f"--model={model}", f"--dataset={data}", f"--port={port}",
        f"--coordinator-port={coord}", "--engine-args=--max-model-len 40960", str(wd),
        "--config.trainer.seq_len_buckets=(4096, 8192)"], env=env, timeout=120)
    assert rc == 0, text[-4000:]
    token = (wd / ".sidecar_token").read_text().strip()
    urls = []
    recs = [json.loads(p.read_text()) for p in out.glob("vllm_*.json")]
    # vLLM listens on loopback only; the jaxrl front is on the node's address (launch/vllm_sidecar.sh).
    assert len(recs) == 4 and all(r["argv"][r["argv"].index("--host") + 1] == "127.0.0.1" for r in recs)
    for host in ("127.0.0.2", "127.0.0.3"):
        for e, gpus in ((0, "0,1"), (1, "2,3")):
            rec, = [r for r in recs if r["env"]["SLURMD_NODENAME"] == host and r["env"]["CUDA_VISIBLE_DEVICES"] == gpus]
            a = rec["argv"]
            assert a[:2] == ["serve", str(model)] and a[a.index("--tensor-parallel-size") + 1] == "2"
            assert a[-2:] == ["--max-model-len", "40960"]
            assert rec["env"]["CUDA_VISIBLE_DEVICES"] == gpus and rec["env"]["VLLM_API_KEY"] == token
            assert rec["env"]["JAXRL_SYNC_DIR"] == str(wd / "sync") and rec["env"]["SLURMD_NODENAME"] == host
            urls.append(f"http://{host}:{port + e}")
    t = json.loads((out / "trainer_0.json").read_text())
    assert not (out / "trainer_1.json").exists()
    assert t["cwd"] == ROOT and t["env"]["SLURMD_NODENAME"] == "127.0.0.1"
    assert t["env"]["JAXRL_COORDINATOR_ADDRESS"] == f"127.0.0.1:{coord}" and t["env"]["JAXRL_NUM_PROCESSES"] == "1"
    assert t["env"]["JAXRL_PROCESS_ID"] == "0"
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in t["env"]["XLA_FLAGS"]
    assert t["argv"] == ["-m", "jaxrl.main", "--config=configs/rloo.py:qwen3_8b", f"--workdir={wd}",
                         "--config.generator.backend=vllm",
                         "--config.generator.sidecar_urls=(" + "".join(f"'{u}'," for u in urls) + ")",
                         f"--config.generator.token_file={wd / '.sidecar_token'}", f"--config.model.path={model}",
                         f"--config.data.dataset_path={data}", "--config.trainer.seq_len_buckets=(4096, 8192)"]
    assert not (_job_dirs(tmp_path)[0] / "leftover_steps.txt").exists()


def test_split_job_trainer_script_passes_arguments_and_process_ids(tmp_path):
    """launch/slurm_train.sh on 2 nodes: one process per node with its id, the first node as the
    coordinator, the engines' URLs as a tuple, overrides with spaces intact."""
    import json

    env, out = _stubs(tmp_path)
    wd = tmp_path / "run"
    cmd = ["sbatch", "--wait", "--nodes=2", f"--output={tmp_path / 'train.out'}", "launch/slurm_train.sh", str(wd),
           "/ckpt/Qwen3-8B", "/data/p.jsonl", "http://n7:8000,http://n8:8000", "--config.trainer.seq_len_buckets=(4096, 8192)"]
    r = subprocess.run(cmd, cwd=ROOT, env={**env, "JAX_COORDINATOR_PORT": "23456"}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (tmp_path / "train.out").read_text()[-3000:]
    recs = [json.loads((out / f"trainer_{i}.json").read_text()) for i in (0, 1)]
    for i, t in enumerate(recs):
        assert t["env"]["JAXRL_PROCESS_ID"] == str(i) and t["env"]["SLURMD_NODENAME"] == NODES[i]
        assert t["env"]["JAXRL_COORDINATOR_ADDRESS"] == "127.0.0.1:23456" and t["env"]["JAXRL_NUM_PROCESSES"] == "2"
        assert t["cwd"] == ROOT
        assert t["argv"] == ["-m", "jaxrl.main", "--config=configs/rloo.py:qwen3_8b", f"--workdir={wd}",
                             "--config.model.path=/ckpt/Qwen3-8B", "--config.data.dataset_path=/data/p.jsonl",
                             "--config.generator.sidecar_urls=('http://n7:8000','http://n8:8000',)",
                             f"--config.generator.token_file={wd / '.sidecar_token'}",
                             "--config.trainer.seq_len_buckets=(4096, 8192)"]


def _stub_job(tmp_path, env, nodes=2, extra=()):
    """Starts a vLLM-layout job with stand-ins (1 trainer node, 1 engine a node) without waiting."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    port, coord = _ports(1, 1)
    out = tmp_path / "job.out"
    cmd = ["sbatch", "--wait", f"--nodes={nodes}", f"--output={out}", "launch/slurm_job.sh", "--train-nodes=1",
           "--engine-tp=4", f"--model={model}", f"--port={port}", f"--coordinator-port={coord}", *extra,
           str(tmp_path / "run")]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out


def test_termination_signal_stops_every_role(tmp_path):
    """scancel / the time limit: SIGTERM to the batch script stops the trainer and the engines."""
    import json
    import signal
    import time

    env, out = _stubs(tmp_path)
    env["STUB_TRAINER_SLEEP"] = "300"
    proc, log = _stub_job(tmp_path, env)
    deadline = time.monotonic() + 60
    while not (out / "trainer_0.json").exists():  # the engines were healthy and the trainer runs
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.1)
    job = _job_dirs(tmp_path)[0]
    os.kill(json.loads((job / "batch.json").read_text())["pid"], signal.SIGTERM)
    assert proc.wait(timeout=60) == 143, log.read_text()
    notes = _notes(log.read_text())
    assert "received a termination signal; stopping every role" in notes[-1], notes
    assert not (job / "leftover_steps.txt").exists()
    assert not list((job / "steps").iterdir())


def test_engine_dying_mid_run_stops_the_trainer_and_the_job(tmp_path):
    """A vLLM engine crashes while the trainer runs (vLLM engines are not restarted): the job stops
    the trainer and ends with exit code 1 and a message."""
    env, out = _stubs(tmp_path)
    # The engine crashes once the trainer has started (a fixed 3 s delay lost the race on a loaded
    # host: the engine died before the trainer started).
    env.update(STUB_TRAINER_SLEEP="300", STUB_VLLM_EXIT_WHEN=str(out / "trainer_0.json"))
    proc, log = _stub_job(tmp_path, env)
    assert proc.wait(timeout=90) == 1, log.read_text()
    text = log.read_text()
    notes = _notes(text)
    assert any("engine 0 (http://127.0.0.2:" in n and "exited with code 3 and has no restarts left" in n
               for n in notes), notes
    assert any("rollout role failed" in n for n in notes), notes
    assert (out / "trainer_0.json").exists()  # the trainer had started and was stopped
    job = _job_dirs(tmp_path)[0]
    assert not (job / "leftover_steps.txt").exists()


def test_local_multiprocess_forwards_sigterm_to_every_process(tmp_path):
    """Issue 25 §5: SIGTERM to launch/local_multiprocess.sh reaches every JAX process (each then
    stops gracefully and says how to resume); on main the script died alone and left its processes
    running. The processes here are a stand-in `python` on PATH that records the signal it gets."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    fake = bin_dir / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    f"trap 'echo \"$JAXRL_PROCESS_ID TERM\" >> {log}; exit 143' TERM\n"
                    f"echo \"$JAXRL_PROCESS_ID started $$\" >> {log}\n"
                    "while :; do sleep 0.05; done\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", "launch/local_multiprocess.sh", "2", str(tmp_path / "run")], cwd=ROOT, env=env)
    try:
        for _ in range(600):  # until both processes run (at most 60 s on a loaded host)
            if log.exists() and log.read_text().count("started") == 2:
                break
            time.sleep(0.1)
        assert log.read_text().count("started") == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        assert sorted(line for line in log.read_text().splitlines() if "TERM" in line) == ["0 TERM", "1 TERM"]
    finally:
        if proc.poll() is None:
            proc.kill()
        for line in (log.read_text().splitlines() if log.exists() else []):  # stand-ins left behind (main)
            if "started" in line:
                try:
                    os.kill(int(line.split()[-1]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
