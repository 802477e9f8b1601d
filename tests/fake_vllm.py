"""A stand-in for ``vllm serve`` (vllm cannot be installed here): the HTTP routes jaxrl's vLLM
front uses, with the request/response shapes written down from vLLM's and OpenAI's documentation
(not from jaxrl's code), and TP "workers" that mix in the real `vllm_worker.OrbaxWeightLoader`.

Emulated (vLLM >= 0.16 with VLLM_SERVER_DEV_MODE=1; ``old=True`` drops the routes that came after
0.10: /pause, /resume, /update_weight_version, /weight_info, /get_world_size):
  GET /health; POST /v1/completions (token-id prompts; ``n`` children use seeds seed+j, as
  vLLM's ParentRequest does; a -inf logprob is reported as -9999.0); POST /collective_rpc
  {"method", "args", "kwargs"} -> {"results": [...]} (non-dict results stringified); POST
  /reset_prefix_cache; POST /pause?mode=...; POST /resume; POST /update_weight_version
  {"new_version"}; GET /weight_info; GET /get_world_size. Like vLLM, the API key (VLLM_API_KEY)
  guards only /v1/* routes: the development routes are open, which is why the jaxrl front exists.

Unlike vLLM (which logs and ignores unknown request fields), unknown fields get 400 here, so a
test sees a field vLLM would have ignored silently.

Fake generation: token t of child j is ``(sum(prompt) + w + seed_j + 7 * t) % 100`` where ``w``
is a fingerprint of the loaded embedding (0 before any load; greedy: seed_j = 0); its logprob is
-0.01 * (t + 1), except token 99, whose logprob is -inf (sent as -9999.0).

Run as the ``vllm`` executable of launch/vllm_sidecar.sh: ``python tests/fake_vllm.py serve MODEL
--host H --port P [...]``; it records its argv and environment to $FAKE_VLLM_RECORD (JSON).
"""
from __future__ import annotations

import json
import os
import sys
import time
import types
import uuid

from fastapi import Request  # module level: FastAPI resolves the handlers' string annotations here

REQUEST_FIELDS = {  # OpenAI CreateCompletionRequest + vLLM's documented extra sampling/output fields
    "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "logprobs", "echo", "stop",
    "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "user", "seed", "suffix",
    "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "return_tokens_as_token_ids", "return_token_ids", "prompt_logprobs", "allowed_token_ids",
}
EOS = 0
INF_TOKEN = 99


class FakeModel:
    def __init__(self):
        self.received = []

    def load_weights(self, weights):
        self.received = [(n, t.float().sum().item()) for n, t in weights]
        return {n for n, _ in self.received}


def make_workers(model_dir: str, tp: int):
    from jaxrl.rollout.vllm_worker import OrbaxWeightLoader

    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)

    class HFConfig:
        def to_dict(self):
            return dict(hf)

    class Worker(OrbaxWeightLoader):
        def __init__(self):
            self.model_runner = types.SimpleNamespace(model=FakeModel(),
                                                      model_config=types.SimpleNamespace(hf_config=HFConfig()))

    return [Worker() for _ in range(tp)]


def make_app(model_dir: str, *, tp: int = 2, api_key: str | None = None, old: bool = False, served_name="policy"):
    """The fake server; ``app.state.fake`` exposes calls (route log), workers, paused flag and
    failure switches (``fail_load_worker``: index of a worker whose load raises;
    ``stale_worker``: index of a worker that reports the old version after a load)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response

    app = FastAPI()
    fake = types.SimpleNamespace(calls=[], bodies=[], workers=make_workers(model_dir, tp), paused=False,
                                 weight_version=None, fail_load_worker=None, stale_worker=None, w=0,
                                 loaded_path=None, probe_shift=0.0)
    with open(os.path.join(model_dir, "config.json")) as f:
        probe_cfg = json.load(f)
    app.state.fake = fake

    @app.middleware("http")
    async def log_and_auth(request: Request, call_next):
        fake.calls.append((request.method, request.url.path))
        if api_key and request.url.path.startswith("/v1"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        fake.bodies.append(body)
        unknown = sorted(set(body) - REQUEST_FIELDS)
        if unknown:
            return JSONResponse({"error": {"message": f"unknown fields {unknown}", "type": "BadRequestError",
                                           "code": 400}}, status_code=400)
        if body.get("model") != served_name:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "NotFoundError", "code": 404}}, status_code=404)
        prompt = body["prompt"]
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt), prompt
        n, max_tokens = body.get("n", 1), body.get("max_tokens", 16)
        greedy = body.get("temperature", 1.0) == 0
        stop_ids = set(body.get("stop_token_ids") or [])
        if not body.get("ignore_eos", False):
            stop_ids.add(EOS)
        as_ids = body.get("return_tokens_as_token_ids", False)
        choices = []
        for j in range(n):
            seed_j = 0 if greedy else (body.get("seed") or 0) + j
            toks, lps, finish, stop_reason = [], [], "length", None
            for t in range(max_tokens):
                tok = (sum(prompt) + fake.w + seed_j + 7 * t) % 100
                toks.append(tok)
                lps.append(-9999.0 if tok == INF_TOKEN else -0.01 * (t + 1))
                if tok in stop_ids:
                    finish, stop_reason = "stop", (None if tok == EOS else tok)
                    break
            names = [f"token_id:{t}" if as_ids else f"<{t}>" for t in toks]
            offsets = [sum(len(x) for x in names[:i]) for i in range(len(names))]
            choice = {"index": j, "text": "".join(names), "finish_reason": finish, "stop_reason": stop_reason,
                      "prompt_logprobs": None,
                      "logprobs": None if body.get("logprobs") is None else {
                          "text_offset": offsets, "token_logprobs": lps, "tokens": names,
                          "top_logprobs": [{nm: lp} for nm, lp in zip(names, lps)]}}
            if body.get("return_token_ids"):
                choice["token_ids"] = toks
                choice["prompt_token_ids"] = prompt
            choices.append(choice)
        if body.get("prompt_logprobs") is not None and fake.loaded_path:
            # vLLM's prompt logprobs (one dict per position, None first) of the weights the workers
            # loaded, computed as the front's probe computes them, plus `probe_shift` (a stale tensor).
            from jaxrl.models import hf_io
            from jaxrl.rollout import weight_probe

            ref = weight_probe.reference_logprobs(fake.loaded_path, hf_io.Qwen3Config.from_hf_dict(probe_cfg), prompt)
            choices[0]["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": float(lp) + fake.probe_shift, "rank": 1, "decoded_token": ""}}
                for t, lp in zip(prompt[1:], ref)]
        n_gen = sum(len(c.get("token_ids") or []) for c in choices)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": served_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n_gen,
                          "completion_tokens": n_gen, "prompt_tokens_details": None},
                "system_fingerprint": None, "kv_transfer_params": None}

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        body = await request.json()
        method, args, kwargs = body.get("method"), body.get("args", []), body.get("kwargs", {})
        assert all(isinstance(a, str) for a in args), args  # vLLM passes string args only
        results = []
        for i, w in enumerate(fake.workers):
            if method == "load_orbax_version" and fake.fail_load_worker == i:
                return JSONResponse({"error": f"worker {i}: CUDA out of memory"}, status_code=500)
            if method == "jaxrl_version" and fake.stale_worker == i:
                results.append(str(w.jaxrl_policy_version - 1))
                continue
            try:
                r = getattr(w, method)(*args, **kwargs)
            except Exception as e:  # vLLM: the exception surfaces as a 500
                return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)
            results.append(r if r is None or isinstance(r, (dict, list)) else str(r))
        if method == "load_orbax_version":
            fake.loaded_path = args[0]
            emb = dict(fake.workers[0].model_runner.model.received).get("model.embed_tokens.weight", 0.0)
            fake.w = int(abs(emb) * 1000) % 50
        return {"results": results}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        return Response(status_code=200)

    if not old:
        @app.post("/pause")
        async def pause(mode: str = "abort"):
            fake.paused = True
            return {"status": "paused"}

        @app.post("/resume")
        async def resume():
            fake.paused = False
            return {"status": "resumed"}

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request):
            fake.weight_version = (await request.json())["new_version"]
            return {"success": True, "new_version": fake.weight_version}

        @app.get("/weight_info")
        async def weight_info():
            return {"weight_version": fake.weight_version}

        @app.get("/get_world_size")
        async def get_world_size(include_dp: bool = True):
            return {"world_size": len(fake.workers)}

    return app


def main(argv):
    """``fake_vllm.py serve MODEL --host H --port P [other vllm serve flags]``."""
    import uvicorn

    assert argv[0] == "serve", argv
    model = argv[1]
    flags = {}
    i = 2
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[argv[i]] = argv[i + 1]
            i += 2
        else:
            flags[argv[i]] = True
            i += 1
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        keys = ["JAXRL_SYNC_DIR", "VLLM_SERVER_DEV_MODE", "VLLM_API_KEY", "PYTHONPATH"]
        with open(record, "w") as f:
            json.dump({"argv": argv, "env": {k: os.environ.get(k) for k in keys}}, f)
    app = make_app(model, tp=int(flags.get("--tensor-parallel-size", 1)), api_key=os.environ.get("VLLM_API_KEY"),
                   served_name=flags.get("--served-model-name", model))
    uvicorn.run(app, host=flags["--host"], port=int(flags["--port"]), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
