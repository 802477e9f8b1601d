"""The sidecar's wire format against the public OpenAI completions schema and vLLM's documented
extra fields (written down here from the docs, not from jaxrl's code), plus the HTTP boundary:
non-finite logprobs, request limits, parameter ranges, error kinds and messages."""
import math
import os
import threading
import time

import httpx
import jsonschema
import numpy as np
import pytest

from jaxrl.rollout import wire
from jaxrl.rollout import weight_sync as ws
from jaxrl.rollout.client import SidecarClient, SidecarError, SidecarRefused, SidecarUnreachable
from jaxrl.rollout.process import free_port
from jaxrl.rollout.server import JaxBackend, create_app
from jaxrl.rollout.types import Completion, SamplingParams
from tests.sidecar_fake_engine import FakeEngine, expected_tokens

TOKEN = "wire-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# --- The public schemas, from the docs ---------------------------------------------------------
# OpenAI API reference, "Create completion" (POST /v1/completions) request body.
OPENAI_REQUEST = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                             {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                             {"type": "array", "minItems": 1,
                              "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}}}]},
        "best_of": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
        "echo": {"type": ["boolean", "null"]},
        "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
        "logit_bias": {"type": ["object", "null"]},
        "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
        "max_tokens": {"type": ["integer", "null"], "minimum": 0},
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 128},
        "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
        "seed": {"type": ["integer", "null"]},
        "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "stream": {"type": ["boolean", "null"]},
        "suffix": {"type": ["string", "null"]},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "user": {"type": "string"},
    },
}
# vLLM docs, "OpenAI-Compatible Server" -> Completions API -> extra parameters (sampling and output).
VLLM_REQUEST_EXTRAS = {
    "top_k": {"type": "integer", "minimum": -1},
    "min_p": {"type": "number"},
    "repetition_penalty": {"type": "number"},
    "stop_token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
    "ignore_eos": {"type": "boolean"},
    "min_tokens": {"type": "integer"},
    "skip_special_tokens": {"type": "boolean"},
    "spaces_between_special_tokens": {"type": "boolean"},
    "include_stop_str_in_output": {"type": "boolean"},
    "return_tokens_as_token_ids": {"type": ["boolean", "null"]},
    "return_token_ids": {"type": ["boolean", "null"]},
    "prompt_logprobs": {"type": ["integer", "null"]},
}
# jaxrl's two documented request extensions (docs/sidecar.md "Routes"); nothing else may be added.
JAXRL_REQUEST_EXTRAS = {"greedy": {"type": "boolean"}, "logprobs_mode": {"enum": ["full", "sampled", "raw"]}}
CLIENT_REQUEST = {**OPENAI_REQUEST, "additionalProperties": False,
                  "properties": {**OPENAI_REQUEST["properties"], **VLLM_REQUEST_EXTRAS, **JAXRL_REQUEST_EXTRAS}}

# OpenAI API reference, the completion object; vLLM adds stop_reason, token_ids and
# prompt_token_ids (return_token_ids) to each choice.
OPENAI_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "text_completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": ["string", "null"]},
        "usage": {"type": "object", "required": ["completion_tokens", "prompt_tokens", "total_tokens"],
                  "properties": {k: {"type": "integer", "minimum": 0}
                                 for k in ("completion_tokens", "prompt_tokens", "total_tokens")}},
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["finish_reason", "index", "logprobs", "text"],
            "properties": {
                "finish_reason": {"enum": ["stop", "length", "content_filter"]},
                "index": {"type": "integer", "minimum": 0},
                "text": {"type": "string"},
                "logprobs": {"anyOf": [{"type": "null"}, {
                    "type": "object", "required": ["text_offset", "token_logprobs", "tokens", "top_logprobs"],
                    "properties": {
                        "text_offset": {"type": "array", "items": {"type": "integer"}},
                        # OpenAI: numbers. vLLM sends null where a position has no logprob; jaxrl
                        # sends null for a non-finite logprob (JSON has no NaN).
                        "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}},
                        "tokens": {"type": "array", "items": {"type": "string"}},
                        "top_logprobs": {"type": "array", "items": {
                            "type": ["object", "null"], "additionalProperties": {"type": ["number", "null"]}}}}}]},
                # vLLM extras:
                "stop_reason": {"type": ["integer", "string", "null"]},
                "token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
                "prompt_token_ids": {"type": ["array", "null"], "items": {"type": "integer"}},
            }}},
    },
}


class _Server:
    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


class NaNEngine(FakeEngine):
    """Returns NaN, -inf and +inf logprobs at positions 1, 2, 3 of every completion."""

    def generate_requests(self, requests):
        out = super().generate_requests(requests)
        for per_req in out:
            for comps in per_req:
                for c in comps:
                    for pos, val in ((1, math.nan), (2, -math.inf), (3, math.inf)):
                        if pos < len(c.logprobs):
                            c.logprobs[pos] = val
        return out


@pytest.fixture()
def serve(tmp_path):
    servers = []

    def start(engine=None, limits=wire.RequestLimits(), sync=True):
        engine = engine or FakeEngine()
        sync_dir = tmp_path / "sync"
        sync_dir.mkdir(exist_ok=True)
        s = _Server(create_app(JaxBackend(engine, batch_wait_ms=1), sync_dir=str(sync_dir) if sync else None,
                               token=TOKEN, limits=limits))
        servers.append(s)
        return engine, s.url, str(sync_dir)

    yield start
    for s in servers:
        s.close()


# --- Schemas ----------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=16, temperature=1.0, n=8, seed=3, stop_token_ids=(2, 5)),
    SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, top_k=20, n=1),
    SamplingParams(max_tokens=4, temperature=1.0, greedy=True),
    SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, logprobs_mode="sampled"),
])
def test_client_request_body_follows_openai_schema_and_vllm_extras(params):
    body = SidecarClient(["http://127.0.0.1:1"]).request_body([[1, 2, 3], [4]], params)
    jsonschema.validate(body, CLIENT_REQUEST)
    # The fields RL relies on, with vLLM's documented meaning:
    assert body["logprobs"] == 0  # only the sampled token's logprob
    assert body["return_token_ids"] is True  # token ids back, no re-tokenization
    assert body["ignore_eos"] is True and body["stop_token_ids"] == list(params.stop_token_ids)
    assert body["top_k"] == (params.top_k if params.top_k > 0 else -1)  # vLLM: -1 disables top-k


def test_sidecar_response_follows_openai_schema_and_vllm_extras(serve):
    _, url, _ = serve()
    body = {"model": "policy", "prompt": [[1, 2, 3], [10, 20]], "max_tokens": 5, "n": 2, "seed": 4,
            "stop_token_ids": [13], "logprobs": 0, "return_token_ids": True}
    jsonschema.validate(body, CLIENT_REQUEST)
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    resp = r.json()
    jsonschema.validate(resp, OPENAI_RESPONSE)
    for k, c in enumerate(resp["choices"]):  # vLLM: prompt-major order, index = prompt * n + sample
        i = k // 2
        assert c["index"] == k and c["prompt_token_ids"] == body["prompt"][i]
        # return_tokens_as_token_ids rendering, one entry per token, top_logprobs = the sampled token
        assert c["logprobs"]["tokens"] == [f"token_id:{t}" for t in c["token_ids"]]
        assert [list(d) for d in c["logprobs"]["top_logprobs"]] == [[f"token_id:{t}"] for t in c["token_ids"]]
        assert c["stop_reason"] == (13 if c["finish_reason"] == "stop" else None)
    n_gen = sum(len(c["token_ids"]) for c in resp["choices"])
    assert resp["usage"] == {"prompt_tokens": 5, "completion_tokens": n_gen, "total_tokens": 5 + n_gen}


# --- Non-finite logprobs ------------------------------------------------------------------------

def test_logprobs_mode_travels_to_the_engine_and_health_reports_both(serve):
    engine, url, _ = serve()
    client = SidecarClient([url], token=TOKEN)
    assert client.health()[url]["logprobs"] == {"backend": "jax", "modes": ["full", "sampled", "raw"]}
    for mode in ("sampled", "full"):
        client.generate([[1, 2]], SamplingParams(max_tokens=2, top_k=5, seed=0, logprobs_mode=mode))
        assert engine.params[-1].logprobs_mode == mode and engine.params[-1].top_k == 5


def test_nan_logprobs_are_sent_as_null_and_read_back_as_nan(serve):
    # Regression (#9 §3): the JSON encoder refused NaN and the sidecar answered 500.
    _, url, _ = serve(engine=NaNEngine())
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 5, "logprobs": 0, "seed": 0},
                   headers=AUTH)
    assert r.status_code == 200, r.text
    lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert lps == [-0.01, None, None, None, -0.05]
    assert [list(d.values())[0] for d in r.json()["choices"][0]["logprobs"]["top_logprobs"]] == lps
    (c,), = SidecarClient([url], token=TOKEN).generate([[1, 2]], SamplingParams(max_tokens=5, seed=0))
    assert c.logprobs[0] == pytest.approx(-0.01) and c.logprobs[4] == pytest.approx(-0.05)
    assert all(math.isnan(x) for x in c.logprobs[1:4])


def test_nan_logprob_through_the_sidecar_ends_the_trajectory_as_invalid_output(serve, chat):
    # The whole path of #9 §3: engine NaN -> JSON null -> client NaN -> the rollout loop's check.
    from jaxrl.envs import RolloutConfig, get_task_suite, run_rollouts

    _, url, _ = serve(engine=NaNEngine())
    task = get_task_suite("arithmetic").make_task(1, "+", 1)
    (t,) = run_rollouts(SidecarClient([url], token=TOKEN), chat, [task], SamplingParams(seed=0),
                        RolloutConfig(max_tokens_per_turn=4))
    assert (t.stop_reason, t.reward, len(t.response_ids)) == ("invalid_output", 0.0, 0)
    assert "logprob nan at generated position 1" in t.info["invalid_output"]


def test_vllm_minus_9999_reads_as_non_finite():
    # vLLM reports a -inf logprob as -9999.0 (OpenAI's convention); it is not a real logprob.
    assert math.isnan(wire.decode_logprob(-9999.0)) and math.isnan(wire.decode_logprob(None))
    assert wire.decode_logprob(-12.5) == -12.5
    assert wire.encode_logprob(float("nan")) is None and wire.encode_logprob(-float("inf")) is None
    with pytest.raises(wire.ProtocolError):
        wire.decode_logprob("x")


# --- Limits and ranges --------------------------------------------------------------------------

@pytest.mark.parametrize("body,status,words", [
    ({"prompt": [1], "max_tokens": 2, "n": 1000000}, 400, "--max-n"),
    ({"prompt": [[1]] * 5, "max_tokens": 2}, 400, "--max-prompts"),
    ({"prompt": [[1]] * 4, "max_tokens": 2, "n": 3}, 400, "--max-rows"),
    ({"prompt": [1] * 40, "max_tokens": 2}, 400, "--max-prompt-tokens"),
    ({"prompt": [1] * 10, "max_tokens": 100, "n": 2}, 400, "--max-total-tokens"),
    ({"prompt": [1] * 20000, "max_tokens": 2}, 413, "--max-body-bytes"),
])
def test_requests_over_a_limit_get_4xx_naming_the_limit(serve, body, status, words):
    # Regression (#9 §8): n = 1000000 was accepted and kept the engine busy for minutes.
    limits = wire.RequestLimits(max_n=8, max_prompts=4, max_rows=10, max_prompt_tokens=32, max_total_tokens=200,
                                max_body_bytes=40000)
    engine, url, _ = serve(limits=limits)
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == status and words in r.json()["error"]["message"], r.text
    assert engine.batches == []  # refused before any engine work


@pytest.mark.parametrize("body,field", [
    ({"prompt": "hello", "max_tokens": 2}, "prompt"),
    ({"prompt": [[1], []], "max_tokens": 2}, "prompt"),
    ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1], "max_tokens": "many"}, "max_tokens"),
    ({"prompt": [1], "temperature": -1}, "temperature"),
    ({"prompt": [1], "temperature": 1e-4}, "temperature"),  # logits / T overflows: NaN sampling
    ({"prompt": [1], "top_p": 1.5}, "top_p"),
    ({"prompt": [1], "top_p": 0}, "top_p"),
    ({"prompt": [1], "top_k": -2}, "top_k"),
    ({"prompt": [1], "n": 0}, "n"),
    ({"prompt": [1], "seed": 2**70}, "seed"),
    ({"prompt": [1], "stop_token_ids": ["x"]}, "stop_token_ids"),
    ({"prompt": [1], "stop_token_ids": [-3]}, "stop_token_ids"),
    ({"prompt": [1], "stream": True}, "stream"),
    ({"prompt": [1], "stop": ["\n"]}, "stop"),
    ({"prompt": [1], "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": [1], "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"prompt": [1], "min_p": 0.1}, "min_p"),
    ({"prompt": [1], "logprobs": 5}, "logprobs"),
    ({"prompt": [1], "logprobs_mode": "raw_logprobs"}, "logprobs_mode"),
    ({"prompt": [1], "greedy": "yes"}, "greedy"),
])
def test_bad_requests_get_400_naming_the_field(serve, body, field):
    engine, url, _ = serve()
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), r.text
    assert engine.batches == []


@pytest.mark.parametrize("raw", [b'{"prompt": [1], "temperature": NaN}', b'{"prompt": [1], "top_p": Infinity}',
                                 b'{"prompt": [1', b'[1, 2]'])
def test_non_finite_numbers_and_bad_json_get_400(serve, raw):
    # Python's JSON parser accepts NaN / Infinity literals; they must not reach the engine.
    engine, url, _ = serve()
    r = httpx.post(url + "/v1/completions", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert engine.batches == []


def test_every_route_but_health_needs_the_token(serve):
    _, url, _ = serve()
    assert httpx.get(url + "/health").status_code == 200
    for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("POST", "/v1/load_weights")):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
            r = httpx.request(method, url + path, json={"prompt": [1]}, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)


# --- Client errors: kinds and words ---------------------------------------------------------------

def test_dead_sidecar_is_unreachable_and_a_refusal_is_refused(serve, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    client = SidecarClient([dead], token=TOKEN, max_retries=1, retry_backoff_s=0.01, connect_timeout_s=1)
    with pytest.raises(SidecarUnreachable) as e:
        client.load_weights(3, "/x/sync/3")
    msg = str(e.value)
    assert dead in msg and "load policy version 3" in msg and "not running or not reachable" in msg
    assert "2 attempts" in msg
    for python_name in ("restart()", "SidecarProcess", "collective_rpc", "load_orbax_version", "_post"):
        assert python_name not in msg
    with pytest.raises(SidecarUnreachable):
        client.generate([[1]], SamplingParams(max_tokens=2))

    _, url, sync = serve()
    ws.publish({"w": np.float32(3.0)}, str(tmp_path / "elsewhere"), 2)
    ok = SidecarClient([url], token=TOKEN, max_retries=0)
    with pytest.raises(SidecarRefused) as e:
        ok.load_weights(2, str(tmp_path / "elsewhere" / "2"))
    assert e.value.status == 403 and url in str(e.value) and "inside the sync directory" in str(e.value)
    with pytest.raises(SidecarRefused) as e:
        SidecarClient([url], token="wrong", max_retries=0).load_weights(2, os.path.join(sync, "2"))
    assert e.value.status == 401 and "token" in str(e.value)
    assert not isinstance(e.value, SidecarUnreachable) and isinstance(e.value, SidecarError)


class FailingLoadEngine(FakeEngine):
    def load_version(self, version_dir, version):
        raise OSError(f"disk quota exceeded while reading {version_dir}")


def test_failed_load_names_url_and_cause_and_keeps_serving_old_weights(serve):
    engine, url, sync = serve(engine=FailingLoadEngine())
    ws.publish({"w": np.float32(3.0)}, sync, 1)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    with pytest.raises(SidecarError) as e:
        client.load_weights(1, os.path.join(sync, "1"))
    msg = str(e.value)
    assert url in msg and "policy version 1" in msg and "disk quota exceeded" in msg and e.value.status == 500
    assert client.expected_version is None and engine.policy_version == 0
    (c,), = client.generate([[1]], SamplingParams(max_tokens=2, seed=0))  # the old weights still serve
    assert c.policy_version == 0 and c.token_ids == expected_tokens([1], 0, 0, 0, 0, 2)[0]


def test_client_refuses_completions_from_another_version(serve):
    engine, url, sync = serve()
    ws.publish({"w": np.float32(2.0)}, sync, 1)
    client = SidecarClient([url], token=TOKEN, max_retries=0)
    client.load_weights(1, os.path.join(sync, "1"))
    engine.policy_version = 0  # what a sidecar restarted without --resume-latest would serve
    with pytest.raises(SidecarError, match="served policy version 0, but every sidecar was told to load version 1"):
        client.generate([[1]], SamplingParams(max_tokens=2, seed=0))


def test_decode_rejects_malformed_responses():
    good = wire.completion_response(wire.ParsedRequest(prompts=[[1]], params=SamplingParams(n=1)),
                                    [[Completion([5, 6], [-0.5, -0.25], "length", 3)]], 3)
    (c,), = wire.decode_completion_response(good, 1, 1)
    assert c.token_ids == [5, 6] and c.logprobs == [-0.5, -0.25] and c.policy_version == 3
    with pytest.raises(wire.ProtocolError, match="expected 2 choices"):
        wire.decode_completion_response(good, 1, 2)
    bad = {**good, "choices": [{**good["choices"][0], "token_ids": [5]}]}
    with pytest.raises(wire.ProtocolError, match="1 token ids but 2 logprobs"):
        wire.decode_completion_response(bad, 1, 1)
    bad = {**good, "choices": [{**good["choices"][0], "finish_reason": "abort"}]}
    with pytest.raises(wire.ProtocolError, match="finish_reason"):
        wire.decode_completion_response(bad, 1, 1)
