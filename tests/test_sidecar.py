"""Sidecar server, client and process handle: protocol and batching against a fake engine in this
process, then end to end with the JAX engine in a child process from a tiny HF checkpoint."""
import concurrent.futures
import dataclasses
import os
import threading
import time

import httpx
import numpy as np
import pytest

from jaxrl.rollout import weight_sync as ws
from jaxrl.rollout.client import SidecarClient, SidecarError, SidecarUnreachable
from jaxrl.rollout.process import SidecarProcess, free_port
from jaxrl.rollout.server import JaxBackend, create_app
from jaxrl.rollout.types import SamplingParams
from tests.sidecar_fake_engine import FakeEngine, expected_tokens

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Server:
    """uvicorn serving an app in a thread of this process."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "in-thread server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture()
def fake(tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    engines, servers = [], []

    def start(n=1, batch_wait_ms=5.0, delay_s=0.0):
        for _ in range(n):
            e = FakeEngine(delay_s=delay_s)
            s = _Server(create_app(JaxBackend(e, batch_wait_ms=batch_wait_ms, max_batch_rows=64), sync_dir=str(sync),
                                   token=TOKEN))
            engines.append(e)
            servers.append(s)
        return engines, [s.url for s in servers], str(sync)

    yield start
    for s in servers:
        s.close()


def test_completions_speak_vllm_shape(fake):
    (engine,), (url,), _ = fake()
    body = {"model": "policy", "prompt": [[1, 2, 3], [10, 20]], "max_tokens": 5, "n": 2, "seed": 4,
            "stop_token_ids": [13], "logprobs": 0, "return_token_ids": True, "temperature": 0.8}
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    resp = r.json()
    assert resp["object"] == "text_completion" and resp["policy_version"] == 0
    choices = resp["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for k, c in enumerate(choices):  # prompt-major order, as vLLM
        i, j = divmod(k, 2)
        prompt = body["prompt"][i]
        toks, reason = expected_tokens(prompt, 0, 4, i, j, 5, (13,))
        assert c["token_ids"] == toks and c["finish_reason"] == reason and c["prompt_token_ids"] == prompt
        assert c["stop_reason"] == (13 if reason == "stop" else None)
        assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in toks]
        np.testing.assert_allclose(c["logprobs"]["token_logprobs"], [-0.01 * (t + 1) for t in range(len(toks))])
    # (1+2+3+0+4+0+0+t) % 100 = 10, 11, 12, 13 -> the first sample stops at 13 after 4 tokens.
    assert choices[0]["token_ids"] == [10, 11, 12, 13] and choices[0]["finish_reason"] == "stop"
    assert resp["usage"] == {"prompt_tokens": 5, "completion_tokens": sum(len(c["token_ids"]) for c in choices),
                             "total_tokens": 5 + sum(len(c["token_ids"]) for c in choices)}
    # A flat prompt is one prompt; temperature 0 means greedy (vLLM convention).
    r = httpx.post(url + "/v1/completions", json={"prompt": [5, 5], "max_tokens": 2, "temperature": 0, "seed": 1},
                   headers=AUTH)
    assert len(r.json()["choices"]) == 1


@pytest.mark.parametrize("body,field", [
    ({"prompt": "hello", "max_tokens": 2}, "prompt"),
    ({"prompt": [[1], []], "max_tokens": 2}, "prompt"),
    ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1], "max_tokens": 2, "temperature": -1}, "temperature"),
    ({"prompt": [1], "max_tokens": 2, "top_p": 1.5}, "top_p"),
    ({"prompt": [1], "max_tokens": 2, "stop_token_ids": ["x"]}, "stop_token_ids"),
    ({"prompt": [1], "max_tokens": 2, "stream": True}, "stream"),
    ({"prompt": [1], "max_tokens": "many"}, "max_tokens"),
])
def test_bad_requests_get_400_naming_the_field(fake, body, field):
    _, (url,), _ = fake()
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and field in r.json()["error"]["message"]


def test_concurrent_requests_are_batched_into_few_engine_calls(fake):
    (engine,), (url,), _ = fake(batch_wait_ms=200)
    client = SidecarClient([url], token=TOKEN)
    prompts = [[i, i + 1] for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: client.generate([p], SamplingParams(max_tokens=3, seed=2))[0], prompts))
    for p, (c,) in zip(prompts, results):
        assert c.token_ids == expected_tokens(p, 0, 2, 0, 0, 3)[0]
    assert sum(engine.batches) == 8 and len(engine.batches) < 8, engine.batches
    client.close()


def test_client_spreads_chunks_over_sidecars(fake):
    engines, urls, _ = fake(n=2, delay_s=0.05)
    client = SidecarClient(urls, token=TOKEN, max_prompts_per_request=2)
    prompts = [[i] * 3 for i in range(8)]
    out = client.generate(prompts, SamplingParams(max_tokens=4, n=2, seed=9))
    assert len(out) == 8 and all(len(g) == 2 for g in out)
    for k, (p, group) in enumerate(zip(prompts, out)):
        # prompt index is relative to its chunk of 2; chunk i is sent with seed chunk_params(seed, i)
        chunk_seed = (9 * 1_000_003 + 7919 * (k // 2 + 1)) % 2**31
        for j, c in enumerate(group):
            assert c.token_ids == expected_tokens(p, 0, chunk_seed, k % 2, j, 4)[0]
    assert all(len(e.batches) > 0 for e in engines), [e.batches for e in engines]
    client.close()


def test_load_weights_requires_token_and_a_path_inside_sync_dir(fake, tmp_path):
    (engine,), (url,), sync = fake()
    ws.publish({"w": np.float32(3.0)}, sync, 1)
    outside = str(tmp_path / "elsewhere")
    ws.publish({"w": np.float32(5.0)}, outside, 2)
    good = {"version": 1, "path": os.path.join(sync, "1")}
    assert httpx.post(url + "/v1/load_weights", json=good).status_code == 401
    bad_token = {"Authorization": "Bearer wrong"}
    assert httpx.post(url + "/v1/load_weights", json=good, headers=bad_token).status_code == 401
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    for path in (os.path.join(outside, "2"), os.path.join(sync, "..", "elsewhere", "2"), "/etc"):
        with pytest.raises(SidecarError, match="403") as e:
            client.load_weights(2, path)
        assert url in str(e.value)
    with pytest.raises(SidecarError, match="400"):
        client.load_weights(7, os.path.join(sync, "1"))  # version does not match the directory
    assert engine.policy_version == 0
    client.load_weights(1, os.path.join(sync, "1"))
    assert engine.policy_version == 1 and engine.w == 3.0
    assert client.health()[url]["policy_version"] == 1
    (c,), = client.generate([[1, 1]], SamplingParams(max_tokens=3, seed=0))
    assert c.policy_version == 1 and c.token_ids == expected_tokens([1, 1], 3, 0, 0, 0, 3)[0]
    client.close()


def test_client_request_body_carries_greedy_and_temperature():
    body = SidecarClient(["http://127.0.0.1:1"]).request_body([[1, 2]], SamplingParams(
        max_tokens=7, temperature=0.7, top_k=0, greedy=True, stop_token_ids=(2,), seed=3))
    assert body["prompt"] == [[1, 2]] and body["max_tokens"] == 7 and body["top_k"] == -1
    assert body["greedy"] is True and body["temperature"] == 0.7  # the front turns greedy into vLLM's T=0
    assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["ignore_eos"] is True
    assert body["stop_token_ids"] == [2] and body["seed"] == 3


def test_dead_sidecar_error_names_it():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = SidecarClient([url], max_retries=1, retry_backoff_s=0.01, connect_timeout_s=1)
    with pytest.raises(SidecarError, match=url.replace(".", r"\.")) as e:
        client.generate([[1]], SamplingParams(max_tokens=2))
    assert "2 attempts" in str(e.value)


# ---------------------------------------------------------------------------------------------
# End to end: the JAX engine in a child process.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from tests.tiny_hf import make_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("e2e")
    ckpt, new_ckpt, sync = str(root / "ckpt"), str(root / "ckpt_new"), str(root / "sync")
    make_tiny_hf_checkpoint(ckpt, seed=0)
    make_tiny_hf_checkpoint(new_ckpt, seed=1)  # the "trained" weights, same architecture
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    os.makedirs(sync)
    proc = SidecarProcess(ckpt, sync_dir=sync, token_file=str(token_file), log_path=str(root / "sidecar.log"),
                          extra_args=["--dtype", "float32", "--max-seq-len", "256", "--max-batch-rows", "8",
                                      "--resume-latest"],
                          env={"PYTHONPATH": REPO, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25"})
    proc.start()
    yield dict(proc=proc, ckpt=ckpt, new_ckpt=new_ckpt, sync=sync, token_file=str(token_file))
    proc.stop()


def test_end_to_end_publish_load_generate_kill_restart(e2e):
    import jax
    import ml_dtypes

    from jaxrl.models import hf_io
    from jaxrl.rollout.sampler import sampler_from_hf

    proc = e2e["proc"]
    health = proc.wait_healthy(timeout_s=180)
    assert health["policy_version"] == 0 and health["backend"] == "jax"
    assert health["gpu_memory"] == {"xla_mem_fraction": 0.25}  # the share it was started with
    client = SidecarClient([proc.url], token_file=e2e["token_file"], max_retries=1, retry_backoff_s=0.1)
    prompts = [[5, 17, 42], [9], [100, 3, 3, 7, 250, 1]]
    greedy = SamplingParams(max_tokens=12, greedy=True)
    v0 = client.generate(prompts, greedy)
    assert all(g[0].policy_version == 0 for g in v0)

    # Publish the new weights as version 1 (bf16) and load them into the sidecar.
    local = sampler_from_hf(e2e["ckpt"], dtype="float32", max_seq_len=256, max_batch_rows=8)
    assert [g[0].token_ids for g in local.generate(prompts, greedy)] == [g[0].token_ids for g in v0]
    _, new_params = hf_io.load_hf_checkpoint(e2e["new_ckpt"])
    stats = ws.publish(new_params, e2e["sync"], 1, dtype="bfloat16")
    assert stats.bytes > 0
    answers = client.load_weights(1, stats.path)
    assert answers[proc.url]["policy_version"] == 1
    assert client.health()[proc.url]["policy_version"] == 1
    v1 = client.generate(prompts, greedy)
    assert all(g[0].policy_version == 1 for g in v1)
    # In-process generation with the same weights, rounded to bf16 independently with ml_dtypes.
    rounded = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), new_params)
    local.set_params(rounded, 1)
    expect = local.generate(prompts, greedy)
    assert [g[0].token_ids for g in v1] == [g[0].token_ids for g in expect]
    assert [g[0].token_ids for g in v1] != [g[0].token_ids for g in v0]
    for a, b in zip(v1, expect):
        np.testing.assert_allclose(a[0].logprobs, b[0].logprobs, atol=1e-5)

    # The logprob definition travels to the engine: "sampled" = renormalised over the top-k set.
    sampled = SamplingParams(max_tokens=6, temperature=0.8, top_k=3, seed=7, logprobs_mode="sampled")
    remote = client.generate(prompts, sampled)
    expect = local.generate(prompts, sampled)
    full = local.generate(prompts, dataclasses.replace(sampled, logprobs_mode="full"))
    for a, b, f in zip(remote, expect, full):
        assert a[0].token_ids == b[0].token_ids == f[0].token_ids
        np.testing.assert_allclose(a[0].logprobs, b[0].logprobs, atol=1e-5)
        assert max(x - y for x, y in zip(a[0].logprobs, f[0].logprobs)) > 1e-3  # renormalised: larger

    # Refusals: wrong token, path outside the sync dir.
    bad = SidecarClient([proc.url], token="nope", max_retries=0)
    with pytest.raises(SidecarError, match="401") as refused_token:
        bad.load_weights(1, stats.path)
    with pytest.raises(SidecarError, match="403") as refused_path:
        client.load_weights(1, e2e["new_ckpt"])
    # What jaxrl.main prints under each: a refusal names its fix; rerunning unchanged cannot help
    # (main told the user to rerun for every sidecar failure).
    from jaxrl.rollout.client import SidecarUnreachable
    from jaxrl.train.fleet import sidecar_fix_text

    assert "--config.generator.token_file" in sidecar_fix_text(refused_token.value)
    assert "SYNC_DIR=<this run's --workdir>/sync" in sidecar_fix_text(refused_path.value)
    assert "Rerun" not in sidecar_fix_text(refused_token.value) + sidecar_fix_text(refused_path.value)
    assert sidecar_fix_text(SidecarUnreachable(proc.url, "no answer")) == (
        "Rerun the same command to resume from the last checkpoint.")

    # Kill the sidecar while it is generating: the client's error names it.
    errors = []

    def long_request():
        try:
            client.generate([[1, 2, 3]], SamplingParams(max_tokens=200, temperature=1.0, seed=0))
        except SidecarError as e:
            errors.append(e)

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 60
    while httpx.get(proc.url + "/health").json()["requests_in_flight"] == 0:
        assert time.monotonic() < deadline and t.is_alive(), "the long request never reached the sidecar"
        time.sleep(0.01)
    proc.kill()
    t.join(60)
    assert len(errors) == 1 and proc.url in str(errors[0]) and isinstance(errors[0], SidecarUnreachable), errors
    # The restarted sidecar resumes the latest committed version and serves again.
    health = proc.restart(timeout_s=180)
    assert health["policy_version"] == 1
    again = client.generate(prompts, greedy)
    assert [g[0].token_ids for g in again] == [g[0].token_ids for g in v1]
    client.close()
    bad.close()


def test_sidecar_killed_during_a_weight_load_is_unreachable_not_refused(tmp_path):
    # The trainer restarts an unreachable sidecar (#9 §8); it must not mistake this for a refusal.
    sync = tmp_path / "sync"
    ws.publish({"w": np.float32(3.0)}, str(sync), 1)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    proc = SidecarProcess("unused", sync_dir=str(sync), token_file=str(token_file), log_path=str(tmp_path / "log"),
                          extra_args=["--engine", "tests.sidecar_fake_engine:make_fake_engine"],
                          env={"PYTHONPATH": REPO, "FAKE_ENGINE_LOAD_DELAY_S": "30",
                               "FAKE_ENGINE_LOAD_STARTED_FILE": str(tmp_path / "load_started")})
    proc.start()
    try:
        proc.wait_healthy(timeout_s=120)
        client = SidecarClient([proc.url], token=TOKEN, max_retries=1, retry_backoff_s=0.05)
        errors = []

        def load():
            try:
                client.load_weights(1, str(sync / "1"))
            except SidecarError as e:
                errors.append(e)

        t = threading.Thread(target=load)
        t.start()
        deadline = time.monotonic() + 60  # polled until the load is in the engine (it then takes 30 s)
        while not (tmp_path / "load_started").exists():
            assert time.monotonic() < deadline and t.is_alive(), "the load never reached the engine"
            time.sleep(0.01)
        proc.kill()
        t.join(60)
        assert len(errors) == 1 and isinstance(errors[0], SidecarUnreachable), errors
        msg = str(errors[0])
        assert proc.url in msg and "load policy version 1" in msg and "not running or not reachable" in msg
        assert client.expected_version is None
    finally:
        proc.stop()
