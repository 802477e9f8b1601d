"""The sidecar's HTTP server: one FastAPI app in front of a generation backend.

Routes (wire format: wire.py):
  * ``GET /health`` (no token): ``{"status": "ok", "backend", "policy_version", "model",
    "logprobs": {...}, "gpu_memory": {...}, "limits": {...}, ...}``.
  * ``POST /v1/completions``, ``GET /v1/models``.
  * ``POST /v1/load_weights {"version": v, "path": p}``: ``p`` must resolve (symlinks and ``..``
    followed) to a committed version directory directly inside the configured sync directory
    (weight_sync.resolve_version_dir). The load waits for the completions in flight, holds new
    ones back until it is done, and answers only after the backend reports version ``v``.
  With a token configured, every route but ``/health`` needs ``Authorization: Bearer <token>``;
  without a sync directory and a token, weight loading is disabled (403). No other route exists:
  nothing reaches an engine's internals.

Backends (one per engine kind): `JaxBackend` runs an in-process engine (the JAX `Sampler`) on one
thread and batches concurrent requests into one engine call (`BatchScheduler`);
`vllm_backend.VllmBackend` proxies to a vLLM server bound to loopback. The CLI that starts either
is ``python -m jaxrl.rollout.sidecar``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import logging
import queue
import random
import threading
import time
from typing import Any, Optional, Protocol, Sequence

from fastapi import Request  # at module level: FastAPI resolves the handlers' string annotations here

from jaxrl.rollout import weight_sync, wire
from jaxrl.rollout.types import LOGPROBS_MODES, Completion, Engine, EngineRequest

log = logging.getLogger("jaxrl.sidecar")


class BackendUnavailable(RuntimeError):
    """The backend cannot serve now (upstream down, weights in an unknown state): HTTP 503."""


class BackendFailed(RuntimeError):
    """The backend's upstream answered with an error or an unreadable response: HTTP 502."""


class LoadFailed(RuntimeError):
    """A weight load failed; the message says why, in words a CLI user understands: HTTP 500."""


class Backend(Protocol):
    """What the app needs from a backend.

    Attributes:
      kind: "jax" or "vllm" (reported by /health).
      eos_token_ids: appended to a request's stop ids unless it sets ``ignore_eos``.
      policy_version: the version served; None when unknown (a failed load left mixed weights).
    """

    kind: str
    eos_token_ids: tuple[int, ...]
    policy_version: Optional[int]

    async def generate(self, request: wire.ParsedRequest) -> list[list[Completion]]:
        """Completions for a validated request whose ``params.seed`` is set. Raises wire.RequestError
        (refused), BackendUnavailable (503) or BackendFailed (502)."""
        ...

    async def load(self, path: str, version: int) -> dict:
        """Loads the committed version at `path` (already checked to lie in the sync directory);
        returns JSON-safe stats. Raises LoadFailed."""
        ...

    async def health(self) -> dict:
        """Backend-specific /health fields, including ``logprobs`` (logprob_modes.sidecar_gap's
        ``info``) and ``gpu_memory``. Raises BackendUnavailable when the engine cannot serve."""
        ...

    async def start(self) -> None:
        """Waits until the engine can serve (called once, before the first request)."""
        ...

    async def aclose(self) -> None:
        ...


# ---------------------------------------------------------------------------------------------
# JAX engine backend
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
    """Runs an `Engine` on one thread; batches requests that arrive within `batch_wait_ms`.

    Weight loads are queued like requests and run between engine calls (the engine keeps no KV
    state across calls, so none survives a swap).

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
        """Queues one request; the future gives, per prompt, `n` Completions."""
        prompts, params = request
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_GenItem(request, len(prompts) * params.n, fut))
        return fut

    def submit_load(self, path: str, version: int) -> concurrent.futures.Future:
        """Queues a weight load; the future gives the engine's `weight_sync.SyncStats`."""
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


class JaxBackend:
    """An in-process `Engine` behind a `BatchScheduler` (the JAX sidecar).

    Args:
      engine: the engine (`jaxrl.rollout.sampler.Sampler`).
      max_batch_rows, batch_wait_ms: see `BatchScheduler`.
      gpu_memory_fraction: the XLA memory fraction this process was started with (reported only).
    """

    kind = "jax"

    def __init__(self, engine: Engine, *, max_batch_rows: int = 64, batch_wait_ms: float = 5.0,
                 gpu_memory_fraction: Optional[float] = None):
        self.engine = engine
        self.eos_token_ids = tuple(getattr(engine, "eos_token_ids", ()))
        self.scheduler = BatchScheduler(engine, max_batch_rows=max_batch_rows, batch_wait_ms=batch_wait_ms)
        self.gpu_memory_fraction = gpu_memory_fraction

    @property
    def policy_version(self) -> Optional[int]:
        return int(self.engine.policy_version)

    async def generate(self, request: wire.ParsedRequest) -> list[list[Completion]]:
        try:
            return await asyncio.wrap_future(self.scheduler.submit((request.prompts, request.params)))
        except ValueError as e:  # the engine rejected the request (e.g. longer than its context)
            raise wire.RequestError(str(e)) from e

    async def load(self, path: str, version: int) -> dict:
        try:
            stats = await asyncio.wrap_future(self.scheduler.submit_load(path, version))
        except Exception as e:
            raise LoadFailed(f"loading policy version {version} from {path} failed: {_describe(e)}") from e
        return {"seconds": float(stats.seconds), "bytes": int(stats.bytes)}

    async def health(self) -> dict:
        return {"logprobs": {"backend": "jax", "modes": list(LOGPROBS_MODES)},  # per request
                "gpu_memory": {"xla_mem_fraction": self.gpu_memory_fraction},
                "rows_in_flight": self.scheduler.rows_in_flight, "engine_calls": self.scheduler.engine_calls}

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        self.scheduler.close()


def _describe(e: BaseException) -> str:
    """An exception in words: its message, or its kind when it has none; a read error of Orbax /
    TensorStore by its cause, without TensorStore's specs (`jaxrl.fileio.read_error_text`)."""
    from jaxrl.fileio import read_error_text

    if "tensorstore" in str(e).lower():
        return read_error_text(e)
    msg = str(e).strip()
    return msg if msg else type(e).__name__


# ---------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------

class _Gate:
    """Completions share the gate; a weight load holds it alone. A load waits for the completions in
    flight, and completions that arrive while a load waits or runs wait for it to finish."""

    def __init__(self):
        self._cond: Optional[asyncio.Condition] = None
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def _c(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    @contextlib.asynccontextmanager
    async def shared(self):
        c = self._c()
        async with c:
            await c.wait_for(lambda: not self._writer and self._writers_waiting == 0)
            self._readers += 1
        try:
            yield
        finally:
            async with c:
                self._readers -= 1
                c.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self):
        c = self._c()
        async with c:
            self._writers_waiting += 1
            try:
                await c.wait_for(lambda: not self._writer and self._readers == 0)
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with c:
                self._writer = False
                c.notify_all()


async def _read_json(request: Request, max_bytes: int) -> Any:
    """The request's JSON body, read up to `max_bytes` (whatever Content-Length claims).

    Raises:
      wire.RequestError: 413 for a larger body, 400 for invalid JSON.
    """
    import json

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise wire.RequestError(f"body: {declared} bytes exceed this sidecar's limit of {max_bytes} "
                                "(server flag --max-body-bytes); split the request", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise wire.RequestError(f"body: more than {max_bytes} bytes, this sidecar's limit (server flag "
                                    "--max-body-bytes); split the request", status=413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as e:
        raise wire.RequestError(f"body: invalid JSON ({e})") from e


def create_app(backend: Backend, *, sync_dir: Optional[str], token: Optional[str],
               limits: wire.RequestLimits = wire.RequestLimits(), model_name: str = "policy",
               resume_latest: bool = False):
    """The FastAPI app of a sidecar serving `backend` (routes and rules: module docstring).

    Args:
      sync_dir: directory weight loads must come from; None disables ``/v1/load_weights``.
      token: shared bearer token; None disables weight loading and leaves the other routes open
        (a sidecar on loopback for tests).
      limits: per-request limits (wire.RequestLimits).
      resume_latest: at start-up, load the newest committed version in `sync_dir` (before any
        completion is served).
    """
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    gate = _Gate()
    state = {"requests_in_flight": 0}

    def error(status: int, message: str, kind: str = "invalid_request_error"):
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    async def do_load(real: str, version: int) -> dict:
        async with gate.exclusive():
            stats = await backend.load(real, version)
            served = backend.policy_version
            if served != version:
                raise LoadFailed(f"after loading policy version {version} from {real} the engine reports "
                                 f"version {served}")
        log.info("serving policy version %d (%s)", version, real)
        return {"policy_version": version, **stats}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await backend.start()
        if resume_latest and sync_dir:
            v = weight_sync.latest_version(sync_dir)
            if v is not None and v != backend.policy_version:
                await do_load(weight_sync.version_path(sync_dir, v), v)
        yield
        await backend.aclose()

    app = FastAPI(title="jaxrl rollout sidecar", lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.state.backend = backend

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if token is not None and request.url.path != "/health":
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer ") or not hmac.compare_digest(auth[7:].encode(), token.encode()):
                return error(401, "missing or wrong bearer token: send the token this sidecar was started with "
                                  "(its --token-file; the trainer's generator.token_file)", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    async def health():
        try:
            extra = await backend.health()
        except BackendUnavailable as e:
            return error(503, str(e), "service_unavailable")
        return {"status": "ok", "backend": backend.kind, "policy_version": backend.policy_version,
                "model": model_name, "requests_in_flight": state["requests_in_flight"],
                "limits": dataclasses.asdict(limits), "weight_loading": bool(sync_dir and token), **extra}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "jaxrl"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            req = wire.parse_completion_request(await _read_json(request, limits.max_body_bytes),
                                                backend.eos_token_ids, limits)
        except wire.RequestError as e:
            return error(e.status, str(e))
        if req.params.seed is None:  # one random seed per request, as vLLM does without a seed
            req.params = dataclasses.replace(req.params, seed=random.getrandbits(31))
        state["requests_in_flight"] += 1
        try:
            async with gate.shared():
                results = await backend.generate(req)
        except wire.RequestError as e:
            return error(e.status, str(e))
        except BackendUnavailable as e:
            return error(503, str(e), "service_unavailable")
        except BackendFailed as e:
            return error(502, str(e), "bad_gateway")
        except Exception as e:
            log.exception("engine error")
            return error(500, f"engine error: {_describe(e)}", "internal_error")
        finally:
            state["requests_in_flight"] -= 1
        version = results[0][0].policy_version if results and results[0] else backend.policy_version
        return JSONResponse(wire.completion_response(req, results, version))

    @app.post("/v1/load_weights")
    async def load_weights(request: Request):
        if token is None or sync_dir is None:
            return error(403, "weight loading is disabled: start the sidecar with --sync-dir and --token-file",
                         "permission_error")
        try:
            body = await _read_json(request, 1 << 16)
        except wire.RequestError as e:
            return error(e.status, str(e))
        version, path = (body.get("version"), body.get("path")) if isinstance(body, dict) else (None, None)
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
            return await do_load(real, version)
        except (LoadFailed, BackendUnavailable, BackendFailed) as e:
            return error(500, str(e), "load_failed")
        except Exception as e:
            log.exception("weight load failed")
            return error(500, f"loading policy version {version} from {real} failed: {_describe(e)}", "load_failed")

    return app
