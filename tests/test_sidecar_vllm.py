"""The vLLM sidecar without vLLM: the jaxrl front (`VllmBackend`) against tests/fake_vllm.py, a
stand-in for vLLM's HTTP API whose workers run the real `vllm_worker.OrbaxWeightLoader`.

Security (#12 §3): loads need the token and a path inside the sync directory; no front route
reaches a vLLM development route. Exactness (#12 §2): the logprob definition is checked per
request and by the client before the first request; a weight load is verified on every worker
before completions resume; request bodies sent upstream use only documented vLLM fields."""
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from jaxrl.rollout import logprob_modes, wire
from jaxrl.rollout import weight_sync as ws
from jaxrl.rollout.client import SidecarClient, SidecarError, SidecarMismatch, SidecarRefused
from jaxrl.rollout.process import free_port
from jaxrl.rollout.server import create_app
from jaxrl.rollout.types import SamplingParams
from jaxrl.rollout.vllm_backend import VllmBackend
from tests import fake_vllm

TOKEN = "front-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV_ROUTES = ["/collective_rpc", "/pause", "/resume", "/is_paused", "/reset_prefix_cache", "/update_weight_version",
              "/weight_info", "/get_world_size", "/sleep", "/wake_up", "/is_sleeping", "/abort_requests",
              "/init_weight_transfer_engine", "/update_weights", "/v1/load_lora_adapter", "/v1/chat/completions",
              "/tokenize", "/metrics", "/docs", "/openapi.json", "/load_weights", "/v1/collective_rpc"]


class _Server:
    def __init__(self, app, host="127.0.0.1"):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "in-thread server did not start"
            time.sleep(0.02)
        self.url = f"http://{host}:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    from jaxrl.models import hf_io
    from tests.tiny_hf import make_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("vllm")
    ckpt, sync, outside = str(root / "ckpt"), str(root / "sync"), str(root / "outside")
    make_tiny_hf_checkpoint(ckpt, seed=0)
    _, params = hf_io.load_hf_checkpoint(ckpt)
    ws.publish(params, sync, 1, dtype="bfloat16")  # as a bf16 trainer publishes (the default keeps float32)
    ws.publish(params, sync, 2, dtype="bfloat16")
    ws.publish(params, outside, 3, dtype="bfloat16")
    return dict(ckpt=ckpt, sync=sync, outside=outside)


@pytest.fixture()
def front(published, monkeypatch):
    monkeypatch.setenv("JAXRL_SYNC_DIR", os.path.realpath(published["sync"]))
    servers = []

    def start(tp=2, old=False, mode="processed_logprobs", dtype=None):
        up = _Server(fake_vllm.make_app(published["ckpt"], tp=tp, api_key=TOKEN, old=old))
        backend = VllmBackend(up.url, api_key=TOKEN, vllm_logprobs_mode=mode, gpu_memory_utilization=0.4,
                              start_timeout_s=10, model_dir=published["ckpt"] if dtype else None, dtype=dtype)
        fr = _Server(create_app(backend, sync_dir=published["sync"], token=TOKEN))
        servers.extend([fr, up])
        return up.server.config.app.state.fake, fr.url, backend

    yield start
    for s in servers:
        s.close()


def _dev_calls(fake):
    return [c for c in fake.calls if c[1] not in ("/health", "/v1/completions")]


def test_loads_need_the_token_and_a_path_inside_the_sync_dir(front, published):
    fake, url, _ = front()
    good = {"version": 1, "path": os.path.join(published["sync"], "1")}
    assert httpx.post(url + "/v1/load_weights", json=good).status_code == 401
    assert httpx.post(url + "/v1/load_weights", json=good, headers={"Authorization": "Bearer no"}).status_code == 401
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    for path in (os.path.join(published["outside"], "3"), os.path.join(published["sync"], "..", "outside", "3"),
                 "/etc"):
        with pytest.raises(SidecarRefused) as e:
            client.load_weights(3, path)
        assert e.value.status == 403 and url in str(e.value)
    assert _dev_calls(fake) == []  # no refused load reached vLLM
    assert all(w.jaxrl_policy_version == 0 for w in fake.workers)


@pytest.mark.parametrize("path", DEV_ROUTES)
def test_no_front_route_reaches_a_vllm_development_route(front, path):
    fake, url, _ = front()
    for method in ("GET", "POST"):
        for headers in ({}, AUTH):
            r = httpx.request(method, url + path, json={"method": "load_orbax_version", "args": ["/etc", "1"]},
                              headers=headers)
            assert r.status_code in ((401,) if not headers else (404, 405)), (method, path, headers, r.status_code)
    assert _dev_calls(fake) == []


def test_front_exposes_only_its_four_routes(front):
    _, url, backend = front()
    app = create_app(backend, sync_dir=None, token=TOKEN)
    paths = {getattr(r, "path", None) for r in app.routes}
    assert paths == {"/health", "/v1/models", "/v1/completions", "/v1/load_weights"}


def test_load_is_verified_on_every_worker_then_new_weights_serve(front, published):
    fake, url, _ = front(tp=3)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    prompts = [[5, 17, 42], [9]]
    before = client.generate(prompts, SamplingParams(max_tokens=6, seed=11, n=2))
    assert all(c.policy_version == 0 for g in before for c in g)
    ans = client.load_weights(1, os.path.join(published["sync"], "1"))[url]
    assert ans["policy_version"] == 1 and ans["workers"] == 3
    assert [w.jaxrl_policy_version for w in fake.workers] == [1, 1, 1]
    # vLLM's own routes, in order: pause, load on every worker, read every worker's version back,
    # world size, prefix-cache reset, vLLM's weight version (set and read), resume.
    assert _dev_calls(fake) == [("POST", "/pause"), ("POST", "/collective_rpc"), ("POST", "/collective_rpc"),
                                ("GET", "/get_world_size"), ("POST", "/reset_prefix_cache"),
                                ("POST", "/update_weight_version"), ("GET", "/weight_info"), ("POST", "/resume")]
    assert fake.weight_version == "1" and not fake.paused
    health = client.health()[url]
    assert health["policy_version"] == 1 and health["backend"] == "vllm"
    assert health["logprobs"] == {"backend": "vllm", "vllm_logprobs_mode": "processed_logprobs"}
    assert health["gpu_memory"] == {"vllm_gpu_memory_utilization": 0.4}
    after = client.generate(prompts, SamplingParams(max_tokens=6, seed=11, n=2))
    assert all(c.policy_version == 1 for g in after for c in g)
    w = fake.w  # the fingerprint of the embedding the workers received
    assert w > 0
    for i, (p, group) in enumerate(zip(prompts, after)):
        seed = wire.derive_seed(11, i)  # one upstream request per prompt, distinct seeds
        for j, c in enumerate(group):  # vLLM's child j of a seeded request uses seed + j
            assert c.token_ids == [(sum(p) + w + seed + j + 7 * t) % 100 for t in range(6)]


def test_failed_or_partial_load_stops_completions_until_a_load_succeeds(front, published):
    fake, url, _ = front(tp=2)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    path = os.path.join(published["sync"], "1")
    fake.fail_load_worker = 1
    with pytest.raises(SidecarError) as e:
        client.load_weights(1, path)
    msg = str(e.value)
    assert url in msg and "policy version 1" in msg and "CUDA out of memory" in msg and e.value.status == 500
    for python_name in ("collective_rpc", "load_orbax_version", "jaxrl_version", "Traceback"):
        assert python_name not in msg
    assert fake.paused  # left paused: worker 0 holds new weights, worker 1 old ones
    with pytest.raises(SidecarError) as e:
        client.generate([[1]], SamplingParams(max_tokens=2, seed=0))
    assert e.value.status == 503 and "unknown state" in str(e.value)
    assert httpx.get(url + "/health").json()["policy_version"] is None

    fake.fail_load_worker, fake.stale_worker = None, 0
    with pytest.raises(SidecarError, match="workers report versions"):
        client.load_weights(1, path)
    fake.stale_worker = None
    client.load_weights(1, path)
    (c,), = client.generate([[1]], SamplingParams(max_tokens=2, seed=0))
    assert c.policy_version == 1 and not fake.paused


def test_a_load_the_probe_disagrees_with_is_a_failed_load(front, published):
    # A real vLLM cannot be made to keep a stale tensor any more (test_vllm_real checks that its loads
    # pass the probe); the stand-in shifts its prompt logprobs as a stale head would.
    fake, url, backend = front(tp=1, dtype="bfloat16")  # the fixture publishes in bfloat16
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    path = os.path.join(published["sync"], "1")
    fake.probe_shift = 0.8  # over bfloat16's tolerance (0.75)
    with pytest.raises(SidecarError) as e:
        client.load_weights(1, path)
    assert e.value.status == 500 and "differ from that version's by up to 0.8" in str(e.value)
    with pytest.raises(SidecarError) as e:
        client.generate([[1]], SamplingParams(max_tokens=2, seed=0))
    assert e.value.status == 503
    probe = [b for b in fake.bodies if b.get("prompt_logprobs") is not None][-1]
    assert probe["max_tokens"] == 1 and len(probe["prompt"]) == 24 and probe["prompt_logprobs"] == 0
    fake.probe_shift = 0.0
    client.load_weights(1, path)
    assert backend.last_load["probe_max_abs_diff"] == 0.0
    (c,), = client.generate([[1]], SamplingParams(max_tokens=2, seed=0))
    assert c.policy_version == 1


def test_a_version_published_in_another_dtype_is_refused_with_the_fix(front, published):
    fake, url, _ = front(tp=1, dtype="float32")
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    with pytest.raises(SidecarError) as e:
        client.load_weights(1, os.path.join(published["sync"], "1"))
    assert "published in bfloat16 but this vLLM computes in float32" in str(e.value)
    assert "--dtype bfloat16" in str(e.value) and "Traceback" not in str(e.value)
    assert ("POST", "/collective_rpc") not in fake.calls  # refused before vLLM is touched


def test_older_vllm_without_pause_loads_through_prefix_cache_reset(front, published):
    fake, url, _ = front(old=True)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    client.load_weights(2, os.path.join(published["sync"], "2"))
    assert _dev_calls(fake) == [("POST", "/pause"), ("POST", "/collective_rpc"), ("POST", "/collective_rpc"),
                                ("GET", "/get_world_size"), ("POST", "/reset_prefix_cache"),
                                ("POST", "/update_weight_version")]  # the 404s of the missing routes
    assert [w.jaxrl_policy_version for w in fake.workers] == [2, 2]


def test_completions_through_the_front_use_documented_vllm_fields(front):
    fake, url, _ = front(tp=1)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    out = client.generate([[3, 3, 3], [49, 50]], SamplingParams(max_tokens=8, seed=5, n=2, temperature=0.8,
                                                               stop_token_ids=(60,)))
    for body in fake.bodies:  # fake_vllm answers 400 to any field vLLM does not document
        assert set(body) <= fake_vllm.REQUEST_FIELDS
        assert isinstance(body["prompt"], list) and isinstance(body["prompt"][0], int)  # one prompt per request
        assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["ignore_eos"] is True
    assert [b["seed"] for b in fake.bodies] == [wire.derive_seed(5, 0), wire.derive_seed(5, 1)]
    # prompt [49, 50]: tokens (99 + seed + j + 7t) % 100; token 99 has logprob -inf (vLLM: -9999.0)
    for j, c in enumerate(out[1]):
        seed = wire.derive_seed(5, 1)
        expect = []
        for t in range(8):
            expect.append((99 + seed + j + 7 * t) % 100)
            if expect[-1] == 60:
                break
        assert c.token_ids == expect
        for t, (tok, lp) in enumerate(zip(c.token_ids, c.logprobs)):
            assert math.isnan(lp) if tok == 99 else lp == pytest.approx(-0.01 * (t + 1))
        assert c.finish_reason == ("stop" if expect[-1] == 60 else "length")
    greedy = client.generate([[7]], SamplingParams(max_tokens=3, temperature=0.7, greedy=True))
    assert fake.bodies[-1]["temperature"] == 0.0  # vLLM's greedy
    assert greedy[0][0].token_ids == [(7 + fake.w + 7 * t) % 100 for t in range(3)]


@pytest.mark.parametrize("mode,logprobs_mode,temperature,top_p,top_k,fix", [
    ("processed_logprobs", "full", 1.0, 0.9, -1, "JAXRL_VLLM_LOGPROBS_MODE=raw_logprobs"),
    ("raw_logprobs", "full", 0.7, 1.0, -1, "JAXRL_VLLM_LOGPROBS_MODE=processed_logprobs"),
    ("processed_logprobs", "full", 0.7, 1.0, 20, "logprobs_mode=sampled"),
])
def test_logprob_definition_is_checked_before_the_first_request(front, mode, logprobs_mode, temperature, top_p,
                                                                top_k, fix):
    fake, url, _ = front(tp=1, mode=mode)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    params = SamplingParams(max_tokens=2, temperature=temperature, top_p=top_p, top_k=max(top_k, 0), seed=0)
    with pytest.raises(SidecarMismatch) as e:
        client.generate([[1]], params)
    assert "generator.logprobs_mode='full'" in str(e.value) and fix in str(e.value)
    assert fake.bodies == []  # nothing was generated with the wrong definition
    # The front refuses such a request too (a client that skips the check).
    body = wire.request_body([[1]], params)
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("logprobs_mode"), r.text
    # Greedy (evaluation) requests are exempt.
    client.generate([[1]], SamplingParams(max_tokens=2, temperature=temperature, top_p=top_p, greedy=True))


def test_sampled_logprobs_pass_on_processed_and_are_refused_on_raw_at_temperature(front):
    params = SamplingParams(max_tokens=2, temperature=0.7, top_p=0.9, seed=0, logprobs_mode="sampled")
    fake, url, _ = front(tp=1, mode="processed_logprobs")
    (c,), = SidecarClient([url], token=TOKEN, max_retries=0).generate([[1]], params)
    assert len(c.token_ids) == 2 and "logprobs_mode" not in fake.bodies[-1]  # never sent to vLLM
    fake, url, _ = front(tp=1, mode="raw_logprobs")
    with pytest.raises(SidecarMismatch, match="JAXRL_VLLM_LOGPROBS_MODE=processed_logprobs"):
        SidecarClient([url], token=TOKEN, max_retries=0).generate([[1]], params)


def test_vllm_logprob_modes_follow_vllms_sampler():
    # processed_logprobs = log_softmax after temperature and the top-k/top-p mask;
    # raw_logprobs = log_softmax of the raw logits. By hand, for each combination:
    cases = {  # (T, top_p, top_k): (processed gives full, processed gives sampled, raw full, raw sampled)
        (1.0, 1.0, -1): (True, True, True, True),
        (0.7, 1.0, -1): (True, True, False, False),
        (1.0, 0.9, -1): (False, True, True, False),
        (1.0, 1.0, 20): (False, True, True, False),
        (0.7, 0.9, 20): (False, True, False, False),
    }
    for (t, p, k), expect in cases.items():
        got = tuple(logprob_modes.vllm_gap(m, lm, t, p, k) is None
                    for m in ("processed_logprobs", "raw_logprobs") for lm in ("full", "sampled"))
        assert got == (expect[0], expect[1], expect[2], expect[3]), (t, p, k, got)
    assert logprob_modes.vllm_mode_for("full", 1.0, 0.9, -1) == "raw_logprobs"
    assert logprob_modes.vllm_mode_for("sampled", 0.7, 0.9, 20) == "processed_logprobs"
    with pytest.raises(ValueError, match="no vLLM logprobs mode"):
        logprob_modes.vllm_mode_for("full", 0.7, 0.9, -1)
    # "raw" (the seed runs' mu): vLLM's raw_logprobs at any settings; processed only at T 1 unfiltered
    for (t, p, k) in cases:
        assert logprob_modes.vllm_gap("raw_logprobs", "raw", t, p, k) is None
        assert (logprob_modes.vllm_gap("processed_logprobs", "raw", t, p, k) is None) == (t == 1.0 and p == 1.0
                                                                                          and k <= 0)
    assert logprob_modes.vllm_mode_for("raw", 1.2, 0.95, 20) == "raw_logprobs"  # the seed sampling


def test_front_reaches_vllm_on_a_unix_socket(published, monkeypatch, tmp_path):
    # JAXRL_VLLM_UDS: vLLM on a socket file (no port at all, even on loopback).
    import asyncio

    import uvicorn

    monkeypatch.setenv("JAXRL_SYNC_DIR", os.path.realpath(published["sync"]))
    sock = str(tmp_path / "vllm.sock")
    server = uvicorn.Server(uvicorn.Config(fake_vllm.make_app(published["ckpt"], tp=1, api_key=TOKEN), uds=sock,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        backend = VllmBackend(f"unix:{sock}", api_key=TOKEN, vllm_logprobs_mode="processed_logprobs")

        async def go():
            await backend.start()
            stats = await backend.load(os.path.join(os.path.realpath(published["sync"]), "2"), 2)
            req = wire.parse_completion_request({"prompt": [4, 5], "max_tokens": 3, "seed": 1})
            out = await backend.generate(req)
            await backend.aclose()
            return stats, out

        stats, out = asyncio.run(go())
        assert stats["workers"] == 1 and backend.policy_version == 2
        assert out[0][0].policy_version == 2 and len(out[0][0].token_ids) == 3
    finally:
        server.should_exit = True
        thread.join(10)


def test_front_module_imports_neither_jax_nor_vllm():
    code = ("import sys; import jaxrl.rollout.sidecar, jaxrl.rollout.vllm_backend, jaxrl.rollout.server; "
            "print('jax' in sys.modules, 'vllm' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": REPO}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr


# ---------------------------------------------------------------------------------------------
# launch/vllm_sidecar.sh end to end: fake `vllm` on PATH, the real front.
# ---------------------------------------------------------------------------------------------

def _non_loopback_address():
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.123", 9))  # TEST-NET: nothing is sent
            addr = s.getsockname()[0]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return None if addr.startswith("127.") else addr
    except OSError:
        return None


def test_launch_script_binds_vllm_to_loopback_behind_the_front(published, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    vllm = bindir / "vllm"
    vllm.write_text(f"#!/bin/sh\nexec {sys.executable} {os.path.join(REPO, 'tests', 'fake_vllm.py')} \"$@\"\n")
    vllm.chmod(0o755)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    record = tmp_path / "record.json"
    host = _non_loopback_address() or "127.0.0.1"
    port = free_port()
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "JAXRL_TOKEN_FILE": str(token),
           "JAXRL_SIDECAR_HOST": host, "JAXRL_VLLM_PORT": str(free_port()), "JAXRL_PYTHON": sys.executable,
           "JAXRL_VLLM_LOGPROBS_MODE": "raw_logprobs", "JAXRL_GPU_MEMORY_UTILIZATION": "0.3",
           "FAKE_VLLM_RECORD": str(record), "PYTHONPATH": REPO, "JAXRL_VLLM_DEVICE": "cpu"}
    log = open(tmp_path / "script.log", "wb")
    proc = subprocess.Popen(["bash", os.path.join(REPO, "launch", "vllm_sidecar.sh"), published["ckpt"], str(port),
                             published["sync"], "--tensor-parallel-size", "2", "--dtype", "bfloat16"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "script.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "script.log").read_text()
            time.sleep(0.3)
        rec = json.loads(record.read_text())
        argv = rec["argv"]
        flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
        assert argv[:2] == ["serve", published["ckpt"]]
        assert flag("--host") == "127.0.0.1" and flag("--port") == env["JAXRL_VLLM_PORT"]  # vLLM: loopback only
        assert flag("--worker-extension-cls") == "jaxrl.rollout.vllm_worker.OrbaxWeightLoader"
        assert flag("--generation-config") == "vllm" and flag("--logprobs-mode") == "raw_logprobs"
        assert flag("--gpu-memory-utilization") == "0.3" and flag("--tensor-parallel-size") == "2"
        assert argv.count("--dtype") == 1 and flag("--dtype") == "bfloat16"  # the run's dtype, given once
        # vLLM on a CPU: eager mode and the scheduler settings seeded requests need.
        assert "--enforce-eager" in argv and "--no-async-scheduling" in argv
        assert flag("--max-num-batched-tokens") == "32768" and flag("--max-num-seqs") == "256"
        assert rec["env"]["JAXRL_SYNC_DIR"] == os.path.realpath(published["sync"])
        assert rec["env"]["VLLM_SERVER_DEV_MODE"] == "1" and rec["env"]["VLLM_API_KEY"] == TOKEN
        assert rec["env"]["PYTHONPATH"].split(":")[0] == REPO
        if host != "127.0.0.1":  # vLLM's port is not reachable on the cluster address; the front is
            with pytest.raises(httpx.ConnectError):
                httpx.post(f"http://{host}:{env['JAXRL_VLLM_PORT']}/collective_rpc", json={"method": "x"}, timeout=2)
        client = SidecarClient([url], token=TOKEN, max_retries=0)
        health = client.health()[url]
        assert health["logprobs"]["vllm_logprobs_mode"] == "raw_logprobs"
        assert health["gpu_memory"] == {"vllm_gpu_memory_utilization": 0.3}
        assert client.load_weights(2, os.path.join(published["sync"], "2"))[url]["workers"] == 2
        (c,), = client.generate([[1, 2]], SamplingParams(max_tokens=3, seed=1))
        assert c.policy_version == 2 and len(c.token_ids) == 3
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        log.close()


def _alive(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    return out.stdout.split()


LOADING_VLLM = """\
import http.server, sys
args = sys.argv[1:]
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        open({marker!r}, "a").close()
        self.send_response(503)
        self.end_headers()

    def log_message(self, *a):
        pass

http.server.HTTPServer((host, port), H).serve_forever()
"""


@pytest.mark.parametrize("fault", ["vllm_fails_at_start", "sigterm_while_vllm_starts"])
def test_launch_script_leaves_no_front_behind_while_vllm_starts(published, tmp_path, fault):
    """The front waits for vLLM's start-up inside uvicorn's lifespan, where uvicorn holds SIGTERM back
    until start-up ends (up to JAXRL_VLLM_START_TIMEOUT, 30 min). On main, a vLLM that failed at
    start, or a SIGTERM to the script while vLLM was starting, left the front running on its port.
    Now the script exits and takes the front with it, within the script's grace period (10 s by default; 2 s
    here, JAXRL_SIDECAR_STOP_GRACE_S: the front is gone only by the SIGKILL at its end)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    vllm = bindir / "vllm"
    health_asked = tmp_path / "health_asked"
    if fault == "vllm_fails_at_start":
        vllm.write_text("#!/bin/sh\nsleep 2; echo 'fake vllm: engine core failed to start' >&2; exit 1\n")
    else:  # a vLLM still loading: /health answers 503 (not ready) forever; the first ask is marked
        vllm.write_text(f"#!{sys.executable}\n" + LOADING_VLLM.format(marker=str(health_asked)))
    vllm.chmod(0o755)
    port = free_port()
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "JAXRL_VLLM_PORT": str(free_port()),
           "JAXRL_PYTHON": sys.executable, "PYTHONPATH": REPO, "JAXRL_VLLM_DEVICE": "cpu",
           "JAXRL_SIDECAR_STOP_GRACE_S": "2"}
    log = open(tmp_path / "script.log", "wb")
    proc = subprocess.Popen(["bash", os.path.join(REPO, "launch", "vllm_sidecar.sh"), published["ckpt"], str(port),
                             published["sync"], "--dtype", "bfloat16"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    front = f"jaxrl.rollout.sidecar --backend vllm .*--port {port} "
    try:
        deadline = time.monotonic() + 120
        while not _alive(front):  # the front is up and waiting for vLLM
            assert proc.poll() is None or fault == "vllm_fails_at_start", (tmp_path / "script.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "script.log").read_text()
            time.sleep(0.2)
        if fault == "sigterm_while_vllm_starts":
            while not health_asked.exists():  # the front is inside its wait for vLLM's /health (polled)
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "script.log").read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)  # to the script only, as a scheduler's kill of the job step
        rc = proc.wait(60)
        assert rc != 0
        deadline = time.monotonic() + 15
        while _alive(front) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(front), (tmp_path / "script.log").read_text()
    finally:
        for pid in _alive(front):
            os.kill(int(pid), signal.SIGKILL)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()


@pytest.mark.parametrize("grace", ["0", "2.5", "ten", "3689348814741910323"])
def test_launch_script_refuses_a_bad_stop_grace_in_one_line(tmp_path, grace):
    """JAXRL_SIDECAR_STOP_GRACE_S must be a whole number of seconds from 1 to 99999 (a loop count in the script;
    5 x 3689348814741910323 overflows bash's arithmetic to -1, which would skip the grace): anything else is
    one line naming it and exit 2, before any process starts and before SYNC_DIR is made (regression,
    fresh-user review: it was made first)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "vllm").write_text("#!/bin/sh\necho started > \"$0.ran\"\n")
    (bindir / "vllm").chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "JAXRL_SIDECAR_STOP_GRACE_S": grace}
    out = subprocess.run(["bash", os.path.join(REPO, "launch", "vllm_sidecar.sh"), str(model), str(free_port()),
                          str(tmp_path / "sync")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr == (
        f"error: JAXRL_SIDECAR_STOP_GRACE_S={grace} is not a whole number of seconds from 1 to 99999. "
        "Fix: e.g. 10\n"), out.stderr
    assert not (bindir / "vllm.ran").exists() and not (tmp_path / "sync").exists()
