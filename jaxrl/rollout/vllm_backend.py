"""The sidecar backend for vLLM: the jaxrl front proxies to a ``vllm serve`` that listens on
loopback (or a unix socket) only, so that vLLM's development endpoints (``/collective_rpc``,
``/pause``, ...) are reachable from this host alone and only through the calls below.

Completions: each prompt of a request becomes one upstream ``/v1/completions`` call (vLLM gives
every prompt of a multi-prompt request the same seed, so identical random streams; child sample j
of a seeded request uses seed + j), with seeds from `wire.derive_seed`, sent concurrently. The
request is checked first against the logprob definition vLLM was started with
(logprob_modes.vllm_gap): a request vLLM would answer with other logprobs is refused (400).
vLLM's -9999.0 (its encoding of -inf) is passed on as a non-finite logprob (JSON null).

Weight loads (the app holds every completion back while one runs):
  1. ``POST /pause?mode=wait`` where vLLM has it (>= 0.16); a 404 means an older vLLM.
  2. ``POST /collective_rpc`` running the jaxrl worker extension's load on every worker
     (vllm_worker.OrbaxWeightLoader); each worker must answer with the requested version.
  3. ``POST /collective_rpc`` reading each worker's version back; every one must be the requested
     version, and their number must be ``GET /get_world_size``'s where vLLM has that route.
  4. ``POST /reset_prefix_cache`` (no KV computed with old weights is reused).
  5. ``POST /update_weight_version`` and ``GET /weight_info`` where vLLM has them (vLLM's own
     record of the version, checked), then ``POST /resume`` if paused.
  6. The probe (weight_probe.py; when the front knows the model, ``--model-dir``): vLLM's prompt
     logprobs of fixed tokens must equal those of the published version, computed here in float64
     from the version's own files (concurrently with steps 1-5), within the served dtype's
     tolerance. This is what shows that every parameter vLLM computes with is the new version's
     (on a CPU vLLM the repacked weights cannot be read back).
  If any step fails, the served version becomes unknown and completions are refused (503) until
  a load succeeds: never a mix of old and new weights.
All of them need ``VLLM_SERVER_DEV_MODE=1`` in vLLM's environment (launch/vllm_sidecar.sh).
This module imports neither JAX nor vLLM.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from jaxrl.rollout import logprob_modes, weight_probe, weight_sync, wire
from jaxrl.rollout.server import BackendFailed, BackendUnavailable, LoadFailed
from jaxrl.rollout.types import Completion

log = logging.getLogger("jaxrl.sidecar")

LOAD_METHOD = "load_orbax_version"  # vllm_worker.OrbaxWeightLoader methods, called on every worker
VERSION_METHOD = "jaxrl_version"


class _NotThere(Exception):
    """The upstream answered 404: this vLLM version lacks the route."""


class VllmBackend:
    """Proxy to one vLLM server (see the module docstring).

    Args:
      upstream: ``http://127.0.0.1:PORT`` or ``unix:/path/to/socket`` of ``vllm serve``.
      api_key: vLLM's ``VLLM_API_KEY`` (the sidecar token), sent as a bearer token upstream.
      vllm_logprobs_mode: the ``--logprobs-mode`` vLLM was started with.
      gpu_memory_utilization: vLLM's ``--gpu-memory-utilization`` (reported by /health).
      model: vLLM's ``--served-model-name``.
      timeout_s: read timeout of one upstream call; a weight load may take `load_timeout_s`.
      start_timeout_s: how long `start` waits for vLLM's /health.
      model_dir: the HF checkpoint vLLM serves (its config.json gives the architecture the probe
        needs); None = no probe (only for tests against a stand-in without prompt logprobs).
      dtype: vLLM's ``--dtype`` ("float32" | "bfloat16"); a version published in another dtype is
        refused, and it sets the probe's tolerance (required with `model_dir`).

    Raises:
      ValueError: bad `vllm_logprobs_mode`, `upstream` or `dtype`. (A `model_dir` without a readable
        Qwen3 config.json fails the first load, naming it.)
    """

    kind = "vllm"
    eos_token_ids: tuple[int, ...] = ()  # vLLM adds the model's EOS itself unless ignore_eos

    def __init__(self, upstream: str, *, api_key: Optional[str], vllm_logprobs_mode: str,
                 gpu_memory_utilization: Optional[float] = None, model: str = "policy", timeout_s: float = 3600.0,
                 load_timeout_s: float = 3600.0, start_timeout_s: float = 1800.0, model_dir: Optional[str] = None,
                 dtype: Optional[str] = None):
        import httpx

        if vllm_logprobs_mode not in logprob_modes.VLLM_MODES:
            raise ValueError(f"vllm_logprobs_mode must be one of {logprob_modes.VLLM_MODES}, got {vllm_logprobs_mode!r}")
        self.upstream = upstream
        self.vllm_logprobs_mode = vllm_logprobs_mode
        self.gpu_memory_utilization = gpu_memory_utilization
        self.model = model
        self.load_timeout_s = load_timeout_s
        self.start_timeout_s = start_timeout_s
        self.policy_version: Optional[int] = 0  # vLLM starts from the checkpoint it was given
        self.dtype = dtype
        self.model_dir = model_dir
        self.probe_cfg = None  # read from model_dir at the first load
        if model_dir is not None and dtype not in weight_probe.TOLERANCE:
            raise ValueError(f"dtype must be one of {sorted(weight_probe.TOLERANCE)} with a model_dir, got {dtype!r}")
        self.last_load: dict = {}
        if upstream.startswith("unix:"):
            transport = httpx.AsyncHTTPTransport(uds=upstream[len("unix:"):])
            base = "http://vllm"
        elif upstream.startswith("http://"):
            transport, base = None, upstream.rstrip("/")
        else:
            raise ValueError(f"upstream must be http://HOST:PORT or unix:/path, got {upstream!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base, transport=transport, headers=headers,
                                       timeout=httpx.Timeout(timeout_s, connect=10.0))

    # -- upstream calls -------------------------------------------------------------------------
    async def _call(self, method: str, path: str, *, json: Any = None, params: Optional[dict] = None,
                    timeout: Optional[float] = None, optional: bool = False, what: str = "") -> Any:
        """One upstream call; returns the decoded JSON (None for an empty body). `what` describes
        the call in words for errors (default: the route).

        Raises:
          _NotThere: 404 and `optional` (an older vLLM without the route).
          BackendUnavailable: vLLM did not answer.
          BackendFailed: vLLM answered with an error (its message included).
        """
        import httpx

        try:
            r = await self._http.request(method, path, json=json, params=params,
                                         timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as e:
            raise BackendUnavailable(f"vLLM at {self.upstream} is not answering ({type(e).__name__}: {e}); is the "
                                     "vllm serve process of this sidecar running?") from e
        if r.status_code == 404 and optional:
            raise _NotThere(path)
        what = what or path
        if r.status_code != 200:
            raise BackendFailed(f"vLLM failed {what} (HTTP {r.status_code}): {_upstream_message(r)}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError as e:
            raise BackendFailed(f"vLLM failed {what}: its answer is not JSON: {r.text[:200]!r}") from e

    async def _rpc(self, method: str, args: list, what: str) -> list:
        out = await self._call("POST", "/collective_rpc", json={"method": method, "args": args},
                               timeout=self.load_timeout_s, what=what)
        results = out.get("results") if isinstance(out, dict) else None
        if not isinstance(results, list) or not results:
            raise LoadFailed(f"vLLM returned no per-worker results ({out!r}); is the jaxrl worker extension loaded "
                             "(--worker-extension-cls jaxrl.rollout.vllm_worker.OrbaxWeightLoader)?")
        return results

    # -- Backend -----------------------------------------------------------------------------------
    async def start(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                await self._call("GET", "/health", timeout=5.0, what="its health check")
                return
            except (BackendUnavailable, BackendFailed) as e:
                if time.monotonic() > deadline:
                    raise BackendUnavailable(f"vLLM at {self.upstream} did not come up within "
                                             f"{self.start_timeout_s:.0f} s: {e}") from e
            await asyncio.sleep(1.0)

    async def health(self) -> dict:
        await self._call("GET", "/health", timeout=10.0, what="its health check")
        return {"logprobs": {"backend": "vllm", "vllm_logprobs_mode": self.vllm_logprobs_mode},
                "gpu_memory": {"vllm_gpu_memory_utilization": self.gpu_memory_utilization},
                "upstream": self.upstream, "last_load": self.last_load}

    async def generate(self, request: wire.ParsedRequest) -> list[list[Completion]]:
        p = request.params
        if not p.greedy:
            gap = logprob_modes.vllm_gap(self.vllm_logprobs_mode, p.logprobs_mode, p.temperature, p.top_p, p.top_k)
            if gap is not None:
                raise wire.RequestError(f"logprobs_mode: this vLLM sidecar (--logprobs-mode {self.vllm_logprobs_mode})"
                                        f" cannot return {p.logprobs_mode!r} logprobs here: {gap}")
        if self.policy_version is None:
            raise BackendUnavailable("the weights of this vLLM sidecar are in an unknown state after a failed weight "
                                     f"load ({self.last_load.get('error', '')}); load a version again")
        version = self.policy_version
        single = len(request.prompts) == 1
        calls = [self._complete_one(prompt, p, p.seed if single else wire.derive_seed(p.seed, i), request.ignore_eos)
                 for i, prompt in enumerate(request.prompts)]
        groups = await asyncio.gather(*calls)
        for g in groups:
            for c in g:
                c.policy_version = version
        return list(groups)

    async def _complete_one(self, prompt: list[int], p, seed: int, ignore_eos: bool) -> list[Completion]:
        body = {"model": self.model, "prompt": [int(t) for t in prompt], "max_tokens": p.max_tokens,
                "temperature": 0.0 if p.greedy else p.temperature, "top_p": p.top_p,
                "top_k": p.top_k if p.top_k > 0 else -1, "n": p.n, "seed": seed,
                "stop_token_ids": list(p.stop_token_ids), "ignore_eos": ignore_eos, "logprobs": 0,
                "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
                "stream": False}
        import httpx

        try:
            r = await self._http.post("/v1/completions", json=body)
        except httpx.TransportError as e:
            raise BackendUnavailable(f"vLLM at {self.upstream} is not answering ({type(e).__name__}); is the vllm "
                                     "serve process of this sidecar running?") from e
        if 400 <= r.status_code < 500:
            raise wire.RequestError(f"vLLM refused the request (HTTP {r.status_code}): {_upstream_message(r)}")
        if r.status_code != 200:
            raise BackendFailed(f"vLLM answered /v1/completions with HTTP {r.status_code}: {_upstream_message(r)}")
        try:
            return wire.decode_completion_response(r.json(), 1, p.n)[0]
        except (ValueError, wire.ProtocolError) as e:
            raise BackendFailed(f"vLLM's completions answer is unreadable: {e}") from e

    async def load(self, path: str, version: int) -> dict:
        t0 = time.perf_counter()
        self.policy_version = None  # unknown until every check below passed
        reference = None
        try:
            self._check_published_dtype(path, version)
            if self.model_dir is not None and self.probe_cfg is None:
                try:
                    self.probe_cfg = _read_model_config(self.model_dir)
                except ValueError as e:
                    raise LoadFailed(f"the load probe needs the served model's architecture: {e}") from e
                self.probe_tokens = weight_probe.probe_tokens(self.probe_cfg.vocab_size)
            if self.probe_cfg is not None:  # computed while vLLM loads
                reference = asyncio.ensure_future(asyncio.to_thread(
                    weight_probe.reference_logprobs, path, self.probe_cfg, self.probe_tokens))
            paused = await self._optional("POST", "/pause", params={"mode": "wait"}, what="pausing generation")
            loaded = await self._rpc(LOAD_METHOD, [path, str(version)], "loading the weights on its workers")
            for i, res in enumerate(loaded):
                got = res.get("policy_version") if isinstance(res, dict) else res
                if got != version:
                    raise LoadFailed(f"vLLM worker {i} of {len(loaded)} answered {res!r} instead of loading policy "
                                     f"version {version}")
            versions = await self._rpc(VERSION_METHOD, [], "reading back each worker's policy version")
            if len(versions) != len(loaded) or any(str(v) != str(version) for v in versions):
                raise LoadFailed(f"after loading policy version {version} the vLLM workers report versions {versions}")
            world = await self._optional("GET", "/get_world_size", what="reporting its number of workers")
            if world is not None and world.get("world_size") != len(loaded):
                raise LoadFailed(f"vLLM has {world.get('world_size')} workers but {len(loaded)} loaded policy "
                                 f"version {version} (data-parallel vLLM is not supported; use one server per "
                                 "engine)")
            reset = await self._optional("POST", "/reset_prefix_cache", what="resetting its prefix cache")
            if reset is None and paused is None:
                raise LoadFailed("vLLM has neither /pause nor /reset_prefix_cache; start it with "
                                 "VLLM_SERVER_DEV_MODE=1 (launch/vllm_sidecar.sh)")
            if await self._optional("POST", "/update_weight_version", json={"new_version": str(version)},
                                    what="recording the weight version") is not None:
                info = await self._optional("GET", "/weight_info", what="reporting its weight version")
                if info is not None and str(info.get("weight_version")) != str(version):
                    raise LoadFailed(f"vLLM reports weight version {info.get('weight_version')!r} after loading "
                                     f"policy version {version}")
            if paused is not None:
                await self._call("POST", "/resume", what="resuming generation")
            probe = await self._probe(version, reference) if reference is not None else None
        except (LoadFailed, BackendUnavailable, BackendFailed) as e:
            if reference is not None and not reference.done():
                reference.cancel()
            self.last_load = {"version": version, "path": path, "error": str(e)}
            raise LoadFailed(f"loading policy version {version} from {path} into vLLM failed: {e}") from e
        self.policy_version = version
        self.last_load = {"version": version, "path": path, "workers": len(loaded),
                          "seconds": time.perf_counter() - t0, "probe_max_abs_diff": probe}
        return {"seconds": self.last_load["seconds"], "workers": len(loaded),
                "bytes": int(sum(r.get("bytes", 0) for r in loaded if isinstance(r, dict)) // len(loaded))}

    def _check_published_dtype(self, path: str, version: int) -> None:
        if self.dtype is None:
            return
        try:
            meta = weight_sync.read_meta(path)
        except (OSError, ValueError) as e:
            raise LoadFailed(f"cannot read the metadata of policy version {version} ({e})") from e
        if meta.get("dtype") != self.dtype:
            raise LoadFailed(f"policy version {version} was published in {meta.get('dtype')} but this vLLM computes in "
                             f"{self.dtype}. Fix: start the sidecar with --dtype {meta.get('dtype')} (the run's "
                             "model.compute_dtype)")

    async def _probe(self, version: int, reference) -> float:
        """vLLM's prompt logprobs of the probe tokens against the published version's (weight_probe.py);
        returns the largest difference. Raises LoadFailed when it exceeds the dtype's tolerance."""
        try:
            want = await reference
        except (KeyError, ValueError, OSError) as e:
            raise LoadFailed(f"the published policy version {version} cannot be read back for the load probe: {e}") from e
        body = {"model": self.model, "prompt": self.probe_tokens, "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "seed": 0, "stream": False}
        out = await self._call("POST", "/v1/completions", json=body, timeout=self.load_timeout_s,
                               what="the load probe (prompt logprobs of fixed tokens)")
        try:
            got = _prompt_logprobs(out, self.probe_tokens)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise LoadFailed(f"vLLM's answer to the load probe has no readable prompt logprobs ({e})") from e
        diff = float(max(abs(a - b) for a, b in zip(got, want)))
        tol = weight_probe.tolerance(self.dtype)
        if not diff <= tol:
            raise LoadFailed(f"after loading policy version {version}, vLLM's logprobs of the probe tokens differ from "
                             f"that version's by up to {diff:.3g} nats (tolerance {tol:g} at {self.dtype}): some "
                             "parameters vLLM computes with are not the new version's; the sidecar refuses "
                             "completions until a load passes")
        log.info("policy version %d: load probe max |diff| %.3g", version, diff)
        return diff

    async def _optional(self, method: str, path: str, **kw) -> Any:
        """`_call` for a route older vLLMs lack: None when absent; {} for an empty 200 answer."""
        try:
            out = await self._call(method, path, timeout=self.load_timeout_s, optional=True, **kw)
        except _NotThere:
            return None
        return {} if out is None else out

    async def aclose(self) -> None:
        await self._http.aclose()


def _read_model_config(model_dir: str):
    import json
    import os

    from jaxrl.models.qwen3_config import Qwen3Config

    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            return Qwen3Config.from_hf_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--model-dir: cannot read a Qwen3 config from {path} ({e})") from e


def _prompt_logprobs(out: dict, tokens: list[int]) -> list[float]:
    """vLLM's ``prompt_logprobs`` (one dict per prompt position, None first) -> the logprob of each
    prompt token after the first. -9999.0 is vLLM's -inf."""
    entries = out["choices"][0]["prompt_logprobs"]
    if len(entries) != len(tokens):
        raise ValueError(f"{len(entries)} prompt positions for {len(tokens)} tokens")
    res = []
    for t, e in zip(tokens[1:], entries[1:]):
        item = e.get(str(t)) or e.get(f"token_id:{t}")
        if item is None:
            raise KeyError(f"token {t} missing from {sorted(e)[:4]}")
        lp = float(item["logprob"] if isinstance(item, dict) else item)
        res.append(float("-inf") if lp <= -9999.0 else lp)
    return res


def _upstream_message(r) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail"):
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return str(body)[:500]
