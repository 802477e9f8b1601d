"""Rollout sidecar: an HTTP server around a generation engine, its process handle, and the client.

Server (`python -m jaxrl.rollout.sidecar --checkpoint DIR --port N --sync-dir DIR --token-file F`):
  * ``POST /v1/completions`` — the token-in/token-out subset of vLLM's OpenAI-compatible
    completions API that RL needs (qwen3_vllm.md §4.2): ``prompt`` as token ids (list of ints or
    list of lists), ``max_tokens``, ``temperature`` (0 = greedy, as in vLLM), ``top_p``, ``top_k``,
    ``n``, ``seed``, ``stop_token_ids``, ``ignore_eos``, ``logprobs`` (sampled-token logprobs in
    ``choices[i].logprobs.token_logprobs``), ``return_token_ids`` (``choices[i].token_ids`` and
    ``prompt_token_ids``). Choices are ordered prompt-major (index = prompt * n + sample), as vLLM
    does. Extensions: request field ``greedy`` (argmax, logprobs still at ``temperature``) and
    response field ``policy_version``. ``text`` is always "" (no detokenization).
  * ``GET /health`` — ``{"status": "ok", "policy_version": v, ...}``.
  * ``POST /v1/load_weights {"version": v, "path": p}`` — needs ``Authorization: Bearer <token>``;
    ``p`` must resolve (symlinks and ``..`` followed) to a committed version directory directly in
    the configured sync directory (weight_sync.py).
  Concurrent requests are collected for ``--batch-wait-ms`` into one engine call; a weight load
  runs between engine calls (the engine keeps no KV state across calls, so none survives a swap).

Process handle: `SidecarProcess` (start / stop / restart / wait_healthy) for the trainer.
Client: `SidecarClient` implements `types.Generator` over one or more sidecars (JAX sidecars or
stock ``vllm serve`` with `vllm_worker.OrbaxWeightLoader`), least-loaded dispatch, timeouts,
bounded retries and errors that name the failing sidecar.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import importlib
import itertools
import logging
import os
import queue
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Optional, Protocol, Sequence

from fastapi import Request  # at module level: FastAPI resolves the handlers' string annotations here

from jaxrl.rollout import weight_sync
from jaxrl.rollout.types import Completion, SamplingParams

log = logging.getLogger("jaxrl.sidecar")

# A request for the engine: prompts (token ids) and the sampling settings shared by them.
EngineRequest = tuple[Sequence[Sequence[int]], SamplingParams]


class Engine(Protocol):
    """What the sidecar server needs from a generation engine.

    Attributes:
      policy_version: version of the weights currently loaded (0 = initial checkpoint).
      eos_token_ids: ids added to a request's stop ids unless it sets ``ignore_eos`` (may be empty).
    """

    policy_version: int
    eos_token_ids: tuple[int, ...]

    def generate_requests(self, requests: Sequence[EngineRequest]) -> list[list[list[Completion]]]:
        """One batched call: for each request, for each prompt, `params.n` completions."""
        ...

    def load_version(self, version_dir: str, version: int) -> weight_sync.SyncStats:
        """Replaces the weights by the committed version in `version_dir`; sets policy_version."""
        ...


# ---------------------------------------------------------------------------------------------
# Scheduler: collects concurrent requests into one engine call; weight loads run between calls.
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _GenItem:
    request: EngineRequest
    rows: int
    future: concurrent.futures.Future


@dataclasses.dataclass
class _LoadItem:
    path: str
    version: int
    future: concurrent.futures.Future


class BatchScheduler:
    """Runs the engine on one thread; batches requests that arrive within `batch_wait_ms`.

    Args:
      engine: the `Engine`.
      max_batch_rows: an engine call holds at most this many rows (prompts x n), except that a
        single larger request is run alone.
      batch_wait_ms: after the first request of a batch, wait this long (ms) for more.
    """

    def __init__(self, engine: Engine, max_batch_rows: int = 64, batch_wait_ms: float = 5.0):
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.engine = engine
        self.max_batch_rows = max_batch_rows
        self.batch_wait_s = batch_wait_ms / 1000.0
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self.rows_in_flight = 0
        self.engine_calls = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="sidecar-engine", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> concurrent.futures.Future:
        prompts, params = request
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_GenItem(request, len(prompts) * params.n, fut))
        return fut

    def submit_load(self, path: str, version: int) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_LoadItem(path, version, fut))
        return fut

    def close(self) -> None:
        self._stop = True
        self._queue.put(None)

    def _load(self, item: _LoadItem) -> None:
        try:
            item.future.set_result(self.engine.load_version(item.path, item.version))
        except BaseException as e:  # reported to the caller of /v1/load_weights
            log.exception("weight load of version %s from %s failed", item.version, item.path)
            item.future.set_exception(e)

    def _run(self) -> None:
        pending: Any = None
        while not self._stop:
            item = pending if pending is not None else self._queue.get()
            pending = None
            if item is None:
                return
            if isinstance(item, _LoadItem):
                self._load(item)
                continue
            batch, rows = [item], item.rows
            deadline = time.monotonic() + self.batch_wait_s
            while rows < self.max_batch_rows:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if not isinstance(nxt, _GenItem) or rows + nxt.rows > self.max_batch_rows:
                    pending = nxt  # a load, a stop, or a request for the next batch
                    break
                batch.append(nxt)
                rows += nxt.rows
            self.rows_in_flight = rows
            try:
                results = self.engine.generate_requests([b.request for b in batch])
                self.engine_calls += 1
                for b, r in zip(batch, results):
                    b.future.set_result(r)
            except BaseException as e:
                log.exception("engine call failed")
                for b in batch:
                    if not b.future.done():
                        b.future.set_exception(e)
            finally:
                self.rows_in_flight = 0


# ---------------------------------------------------------------------------------------------
# HTTP server
# ---------------------------------------------------------------------------------------------

class RequestError(ValueError):
    """A malformed request (HTTP 400); the message names the field."""


def parse_completion_request(body: dict, eos_token_ids: Sequence[int] = ()) -> tuple[list[list[int]], SamplingParams, dict]:
    """Validates a ``/v1/completions`` JSON body.

    Returns:
      (prompts as lists of token ids, SamplingParams, options {"logprobs": int|None,
      "return_token_ids": bool, "model": str}).
    Raises:
      RequestError: naming the offending field and what to send instead.
    """
    if body.get("stream"):
        raise RequestError("stream: streaming is not supported by this sidecar; send stream=false")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [prompt]
    elif (isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt)
          and all(isinstance(t, int) and not isinstance(t, bool) for p in prompt for t in p)):
        prompts = prompt
    else:
        raise RequestError("prompt: this sidecar is token-in only; send a non-empty list of token ids "
                           "or a list of non-empty lists of token ids (text prompts are not accepted)")
    if any(t < 0 for p in prompts for t in p):
        raise RequestError("prompt: token ids must be >= 0")

    def num(name, default, kind):
        v = body.get(name, default)
        if v is None:
            v = default
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise RequestError(f"{name}: expected an integer, got {v!r}")
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise RequestError(f"{name}: expected a number, got {v!r}")
        return kind(v)

    temperature = num("temperature", 1.0, float)
    greedy = bool(body.get("greedy", False))
    if temperature == 0.0:  # vLLM's convention: temperature 0 = greedy, logprobs of the raw logits
        greedy, temperature = True, 1.0
    stop = body.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop):
        raise RequestError(f"stop_token_ids: expected a list of integers, got {stop!r}")
    if body.get("stop"):
        raise RequestError("stop: stop strings are not supported (token-out engine); use stop_token_ids")
    if not body.get("ignore_eos", False):
        stop = list(stop) + [t for t in eos_token_ids if t not in stop]
    top_k = num("top_k", -1, int)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed: expected an integer or null, got {seed!r}")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise RequestError(f"logprobs: expected a non-negative integer or null, got {logprobs!r}")
    try:
        params = SamplingParams(
            max_tokens=num("max_tokens", 16, int), temperature=temperature, top_p=num("top_p", 1.0, float),
            top_k=0 if top_k < 0 else top_k, stop_token_ids=tuple(stop), n=num("n", 1, int), seed=seed,
            greedy=greedy)
    except ValueError as e:
        raise RequestError(str(e)) from e
    return prompts, params, {"logprobs": logprobs, "return_token_ids": bool(body.get("return_token_ids", False)),
                             "model": body.get("model") or "policy"}


def completion_response(prompts: list[list[int]], results: list[list[Completion]], options: dict,
                        policy_version: int) -> dict:
    """Builds a vLLM-shaped ``/v1/completions`` response (plus ``policy_version``)."""
    choices = []
    n_gen = 0
    for prompt, comps in zip(prompts, results):
        for c in comps:
            n_gen += len(c.token_ids)
            lp = None
            if options["logprobs"] is not None:
                toks = [f"token_id:{t}" for t in c.token_ids]
                lp = {"text_offset": [0] * len(toks), "token_logprobs": [float(x) for x in c.logprobs],
                      "tokens": toks, "top_logprobs": [{t: float(x)} for t, x in zip(toks, c.logprobs)]}
            choices.append({
                "index": len(choices), "text": "", "logprobs": lp, "finish_reason": c.finish_reason,
                "stop_reason": c.token_ids[-1] if c.finish_reason == "stop" and c.token_ids else None,
                "token_ids": list(c.token_ids), "prompt_token_ids": list(prompt),
            })
    n_prompt = sum(len(p) for p in prompts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": options["model"], "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen},
            "policy_version": policy_version}


def create_app(engine: Engine, *, sync_dir: Optional[str], token: Optional[str], max_batch_rows: int = 64,
               batch_wait_ms: float = 5.0, model_name: str = "policy"):
    """The FastAPI app of a sidecar serving `engine`.

    Args:
      sync_dir: directory weight loads must come from; None disables ``/v1/load_weights``.
      token: shared bearer token for ``/v1/load_weights``; None disables weight loading.
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    scheduler = BatchScheduler(engine, max_batch_rows=max_batch_rows, batch_wait_ms=batch_wait_ms)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        scheduler.close()

    app = FastAPI(title="jaxrl rollout sidecar", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.engine = engine
    state = {"requests_in_flight": 0}

    def error(status: int, message: str, kind: str = "invalid_request_error"):
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.get("/health")
    async def health():
        return {"status": "ok", "policy_version": engine.policy_version, "model": model_name,
                "requests_in_flight": state["requests_in_flight"], "rows_in_flight": scheduler.rows_in_flight,
                "engine_calls": scheduler.engine_calls}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "jaxrl"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("body: expected a JSON object")
            prompts, params, options = parse_completion_request(body, getattr(engine, "eos_token_ids", ()))
        except RequestError as e:
            return error(400, str(e))
        except ValueError as e:
            return error(400, f"body: invalid JSON ({e})")
        if params.seed is None:  # one random seed per request, as vLLM does without a seed
            params = dataclasses.replace(params, seed=random.getrandbits(31))
        state["requests_in_flight"] += 1
        try:
            results = await asyncio.wrap_future(scheduler.submit((prompts, params)))
        except ValueError as e:  # the engine rejected the request (e.g. longer than its context)
            return error(400, str(e))
        except Exception as e:
            return error(500, f"engine error: {type(e).__name__}: {e}", "internal_error")
        finally:
            state["requests_in_flight"] -= 1
        version = results[0][0].policy_version if results and results[0] else engine.policy_version
        return completion_response(prompts, results, options, version)

    @app.post("/v1/load_weights")
    async def load_weights(request: Request):
        if token is None or sync_dir is None:
            return error(403, "weight loading is disabled: start the sidecar with --sync-dir and --token-file",
                         "permission_error")
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not hmac.compare_digest(auth[7:].encode(), token.encode()):
            return error(401, "missing or wrong bearer token for /v1/load_weights", "authentication_error")
        try:
            body = await request.json()
            version, path = body["version"], body["path"]
        except (ValueError, KeyError, TypeError):
            return error(400, 'body: expected {"version": int, "path": str}')
        if isinstance(version, bool) or not isinstance(version, int) or not isinstance(path, str):
            return error(400, 'body: expected {"version": int, "path": str}')
        try:
            real, dir_version = weight_sync.resolve_version_dir(sync_dir, path)
        except PermissionError as e:
            return error(403, str(e), "permission_error")
        except FileNotFoundError as e:
            return error(404, str(e), "not_found_error")
        if dir_version != version:
            return error(400, f"version: {version} does not match the directory {real} (version {dir_version})")
        try:
            stats = await asyncio.wrap_future(scheduler.submit_load(real, version))
        except Exception as e:
            return error(500, f"weight load failed: {type(e).__name__}: {e}", "internal_error")
        return {"policy_version": engine.policy_version, "seconds": stats.seconds, "bytes": stats.bytes}

    return app


def _import_factory(spec: str):
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--engine: expected 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), name)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxrl.rollout.sidecar", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="HF checkpoint directory of the initial policy (version 0)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sync-dir", default=None, help="directory that weight loads must come from")
    p.add_argument("--token-file", default=None, help="file holding the shared bearer token for weight loads")
    p.add_argument("--resume-latest", action="store_true",
                   help="after loading --checkpoint, load the newest committed version in --sync-dir")
    p.add_argument("--max-batch-rows", type=int, default=64, help="rows (prompts x n) per engine call")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long to collect requests into a batch")
    p.add_argument("--max-seq-len", type=int, default=4096, help="prompt + generated tokens per row")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="engine compute dtype")
    p.add_argument("--model-name", default="policy")
    p.add_argument("--engine", default="jaxrl.rollout.sampler:engine_from_args",
                   help="'module:function' building the engine from these parsed arguments")
    p.add_argument("--log-level", default="info")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="exit when the process that started this one dies (trainer-owned sidecars)")
    return p


def _exit_with_parent() -> None:
    """Exits this process as soon as its parent dies (e.g. the trainer was killed with SIGKILL)."""
    parent = os.getppid()

    def watch():
        while True:
            if os.getppid() != parent:
                log.warning("parent process %d is gone; exiting", parent)
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_arg_parser().parse_args(argv)
    if args.exit_with_parent:
        _exit_with_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
        if not token:
            raise SystemExit(f"--token-file {args.token_file} is empty")
    engine = _import_factory(args.engine)(args)
    if args.resume_latest and args.sync_dir:
        v = weight_sync.latest_version(args.sync_dir)
        if v is not None:
            engine.load_version(weight_sync.version_path(args.sync_dir, v), v)
    log.info("serving policy version %d on %s:%d", engine.policy_version, args.host, args.port)
    import uvicorn

    app = create_app(engine, sync_dir=args.sync_dir, token=token, max_batch_rows=args.max_batch_rows,
                     batch_wait_ms=args.batch_wait_ms, model_name=args.model_name)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())


# ---------------------------------------------------------------------------------------------
# Process handle
# ---------------------------------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SidecarProcess:
    """A JAX sidecar run as a child process (``python -m jaxrl.rollout.sidecar``).

    The port is fixed at construction (a free one if `port` is 0), so `url` stays valid across
    restarts. Output goes to `log_path` (default: a file next to the sync dir or in /tmp).

    Args:
      checkpoint: HF checkpoint directory.
      sync_dir, token_file: passed through (needed for weight loads).
      extra_args: further command-line arguments (e.g. ["--max-seq-len", "512"]).
      env: extra environment variables for the child.
    """

    def __init__(self, checkpoint: str, *, port: int = 0, host: str = "127.0.0.1", sync_dir: Optional[str] = None,
                 token_file: Optional[str] = None, extra_args: Sequence[str] = (), env: Optional[dict] = None,
                 log_path: Optional[str] = None):
        self.host = host
        self.port = port or free_port(host)
        self.cmd = [sys.executable, "-m", "jaxrl.rollout.sidecar", "--checkpoint", checkpoint, "--host", host,
                    "--port", str(self.port)]
        if sync_dir:
            self.cmd += ["--sync-dir", sync_dir]
        if token_file:
            self.cmd += ["--token-file", token_file]
        self.cmd += list(extra_args)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or os.path.join("/tmp", f"jaxrl_sidecar_{self.port}.log")
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "SidecarProcess":
        """Starts the process (no-op if running). Call `wait_healthy` before sending requests."""
        if self.alive():
            return self
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def _log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float = 300.0) -> dict:
        """Blocks until ``GET /health`` answers; returns its JSON.

        Raises:
          RuntimeError: the process exited (with the tail of its log) or was never started.
          TimeoutError: not healthy within `timeout_s`.
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise RuntimeError(f"sidecar {self.url} is not running (exit code {self.returncode}); "
                                   f"log {self.log_path}:\n{self._log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"sidecar {self.url} not healthy after {timeout_s} s; log {self.log_path}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL now (what a crash looks like to the client)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout_s: float = 300.0) -> dict:
        """stop + start + wait_healthy; returns the health JSON."""
        self.stop()
        return self.start().wait_healthy(timeout_s)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------------

class SidecarError(RuntimeError):
    """A sidecar failed or refused; `url` names it."""

    def __init__(self, url: str, message: str, status: Optional[int] = None):
        super().__init__(f"sidecar {url}: {message}")
        self.url = url
        self.status = status


def chunk_params(params: SamplingParams, chunk_index: int) -> SamplingParams:
    """The sampling params of chunk `chunk_index` of a split request: a seed derived from the
    request's seed and the chunk index, so different chunks never share a random stream."""
    if params.seed is None:
        return params
    return dataclasses.replace(params, seed=(int(params.seed) * 1_000_003 + 7919 * (chunk_index + 1)) % 2**31)


class SidecarClient:
    """`types.Generator` over one or more sidecars (JAX sidecars or ``vllm serve`` + our worker).

    Each `generate` call splits its prompts into chunks of `max_prompts_per_request` and sends them
    concurrently, each to the sidecar with the fewest requests in flight (ties: round-robin).
    Transport errors and 502/503/504 are retried up to `max_retries` times with exponential backoff,
    on another sidecar when there is one; then `SidecarError` names the sidecar(s) that failed.
    4xx answers are not retried.

    Args:
      urls: base URLs, e.g. ["http://127.0.0.1:8001"].
      token / token_file: shared bearer token (sent on every request; required for weight loads).
      backend: "jax" (our sidecar) or "vllm" (stock vllm serve with `vllm_worker.OrbaxWeightLoader`).
      timeout_s: read timeout of one HTTP request (s); connect timeout is `connect_timeout_s`.
    """

    def __init__(self, urls: Sequence[str] | str, *, token: Optional[str] = None, token_file: Optional[str] = None,
                 backend: str = "jax", timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 max_retries: int = 2, retry_backoff_s: float = 0.5, max_prompts_per_request: int = 64,
                 model: str = "policy", max_workers: int = 32):
        import httpx

        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("SidecarClient: urls must name at least one sidecar")
        if backend not in ("jax", "vllm"):
            raise ValueError(f"SidecarClient: backend must be 'jax' or 'vllm', got {backend!r}")
        if token_file is not None:
            with open(token_file) as f:
                token = f.read().strip()
        self.urls = [u.rstrip("/") for u in urls]
        self.backend = backend
        self.model = model
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.max_prompts_per_request = max_prompts_per_request
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
                                  limits=httpx.Limits(max_connections=max_workers * 2))
        self._lock = threading.Lock()
        self._in_flight = {u: 0 for u in self.urls}
        self._rr = itertools.count()
        self._versions = {u: 0 for u in self.urls}  # for vLLM, which does not report a version
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- dispatch ------------------------------------------------------------------------------
    def _pick(self, exclude: set) -> str:
        with self._lock:
            candidates = [u for u in self.urls if u not in exclude] or list(self.urls)
            start = next(self._rr)
            order = candidates[start % len(candidates):] + candidates[:start % len(candidates)]
            url = min(order, key=lambda u: self._in_flight[u])
            self._in_flight[url] += 1
            return url

    def _release(self, url: str) -> None:
        with self._lock:
            self._in_flight[url] -= 1

    def _post(self, path: str, body: dict, url: Optional[str] = None) -> tuple[str, dict]:
        """POSTs with retries; returns (url that answered, JSON). `url` pins the sidecar."""
        import httpx

        failed: set = set()
        errors = []
        for attempt in range(self.max_retries + 1):
            target = url or self._pick(failed)
            try:
                r = self._http.post(target + path, json=body)
            except httpx.TransportError as e:
                errors.append(f"{target}: {type(e).__name__}: {e or 'connection lost'}")
                failed.add(target)
            else:
                if r.status_code == 200:
                    return target, r.json()
                msg = _error_message(r)
                if r.status_code not in (502, 503, 504):
                    raise SidecarError(target, f"POST {path} answered {r.status_code}: {msg}", r.status_code)
                errors.append(f"{target}: HTTP {r.status_code}: {msg}")
                failed.add(target)
            finally:
                if url is None:
                    self._release(target)
            if attempt < self.max_retries:
                time.sleep(self.retry_backoff_s * 2 ** attempt)
        names = ", ".join(sorted(failed))
        raise SidecarError(names, f"POST {path} failed after {self.max_retries + 1} attempts (is the sidecar "
                                  f"process alive? restart it with SidecarProcess.restart()): " + "; ".join(errors))

    # -- generation ----------------------------------------------------------------------------
    def request_body(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> dict:
        """The ``/v1/completions`` body for `prompts` (vLLM-compatible; see module docstring)."""
        body = {"model": self.model, "prompt": [list(map(int, p)) for p in prompts], "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p,
                "top_k": params.top_k if params.top_k > 0 else -1, "n": params.n,
                "stop_token_ids": list(params.stop_token_ids), "ignore_eos": True, "logprobs": 0,
                "return_token_ids": True, "skip_special_tokens": False}
        if params.seed is not None:
            body["seed"] = params.seed
        if params.greedy:
            if self.backend == "vllm":
                body["temperature"] = 0.0  # vLLM greedy; its logprobs are then those of temperature 1
            else:
                body["greedy"] = True
        return body

    def _complete(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        url, resp = self._post("/v1/completions", self.request_body(prompts, params))
        version = resp.get("policy_version", self._versions.get(url, 0))
        choices = sorted(resp["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts) * params.n:
            raise SidecarError(url, f"expected {len(prompts) * params.n} choices, got {len(choices)}")
        out = []
        for i in range(len(prompts)):
            group = []
            for c in choices[i * params.n:(i + 1) * params.n]:
                if c.get("token_ids") is None or not c.get("logprobs"):
                    raise SidecarError(url, "response lacks token_ids or logprobs; the server must support "
                                            "return_token_ids and logprobs (vLLM >= 0.10.2)")
                lps = c["logprobs"]["token_logprobs"]
                group.append(Completion(token_ids=list(c["token_ids"]), logprobs=[float(x) for x in lps],
                                        finish_reason=c["finish_reason"], policy_version=int(version)))
            out.append(group)
        return out

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `params.n` completions (types.Generator). Thread-safe.

        Raises:
          SidecarError: a sidecar refused the request or every attempt failed (names the URL).
        """
        if not prompts:
            return []
        # vLLM seeds each prompt of a multi-prompt request with the same seed (identical random
        # streams across prompts), so it gets one prompt per request.
        k = 1 if self.backend == "vllm" else self.max_prompts_per_request
        chunks = [prompts[i:i + k] for i in range(0, len(prompts), k)]
        if len(chunks) == 1:
            return self._complete(chunks[0], params)
        futures = [self._pool.submit(self._complete, c, chunk_params(params, i)) for i, c in enumerate(chunks)]
        return [g for f in futures for g in f.result()]

    # -- control -------------------------------------------------------------------------------
    def health(self) -> dict[str, dict]:
        """{url: health JSON} of every sidecar (vLLM: {"status": "ok", "policy_version": tracked})."""
        import httpx

        out = {}
        for u in self.urls:
            try:
                r = self._http.get(u + "/health")
            except httpx.TransportError as e:
                raise SidecarError(u, f"GET /health failed: {type(e).__name__}: {e}") from e
            if r.status_code != 200:
                raise SidecarError(u, f"GET /health answered {r.status_code}", r.status_code)
            out[u] = r.json() if self.backend == "jax" else {"status": "ok", "policy_version": self._versions[u]}
        return out

    def load_weights(self, version: int, path: str) -> dict[str, dict]:
        """Asks every sidecar to load committed version `version` at `path`; returns {url: answer}.

        JAX sidecars: ``POST /v1/load_weights``. vLLM: ``POST /collective_rpc`` running
        `OrbaxWeightLoader.load_orbax_version` on every worker, then ``POST /reset_prefix_cache``
        (both need VLLM_SERVER_DEV_MODE=1; see launch/vllm_sidecar.sh).

        Raises:
          SidecarError: naming the sidecar that refused or failed.
        """
        futures = {u: self._pool.submit(self._load_one, u, version, path) for u in self.urls}
        return {u: f.result() for u, f in futures.items()}

    def _load_one(self, url: str, version: int, path: str) -> dict:
        if self.backend == "jax":
            _, resp = self._post("/v1/load_weights", {"version": int(version), "path": path}, url=url)
            if resp.get("policy_version") != version:
                raise SidecarError(url, f"reports policy version {resp.get('policy_version')} after loading {version}")
        else:
            _, resp = self._post("/collective_rpc", {"method": "load_orbax_version", "args": [path, str(int(version))]},
                                 url=url)
            self._post("/reset_prefix_cache", {}, url=url)
        self._versions[url] = int(version)
        return resp


def _error_message(r) -> str:
    try:
        body = r.json()
        return body.get("error", {}).get("message") or str(body)
    except ValueError:
        return r.text[:500]


if __name__ == "__main__":
    main()
