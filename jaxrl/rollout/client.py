"""The trainer's client of one or more rollout sidecars (JAX sidecars, or vLLM behind the jaxrl
front: both speak wire.py's protocol, so the client has no per-engine code paths).

`SidecarClient` implements `types.Generator`: each `generate` call splits its prompts into chunks
of `max_prompts_per_request` and sends them concurrently, each to the sidecar with the fewest
requests in flight (ties: round-robin). Before the first request with given sampling settings it
checks, from every sidecar's ``/health``, that the sidecar returns the logprob definition the
request asks for (logprob_modes.py). `load_weights` has every sidecar load a published version and
returns only when each reports that version; from then on a completion from any other version is
an error. With `in_flight_updates=True` (asynchronous RL: versions are loaded while requests are in
flight) a completion may report any version at least the one expected when its request was sent.
`load_weights(..., partial_ok=True)` takes a sidecar that fails to load out of rotation (no
request is sent to it) until a later load on it succeeds.

Errors are `SidecarError`s naming the sidecar's URL, in three kinds the trainer can tell apart:
`SidecarUnreachable` (connection refused or lost, timeouts: the process may be dead; restart it),
`SidecarRefused` (the sidecar answered 4xx: a bad request, a wrong token, a path outside its sync
directory; retrying the same call cannot help) and `SidecarMismatch` (the sidecar runs with
settings the run cannot use). Transport errors and 502/503/504 are retried up to `max_retries`
times with exponential backoff, on another sidecar when there is one.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from typing import Optional, Sequence

from jaxrl.rollout import logprob_modes, wire
from jaxrl.rollout.types import Completion, SamplingParams


class SidecarError(RuntimeError):
    """A sidecar failed; `url` names it (several, comma-separated, after retries on others);
    `status` is the HTTP status when the sidecar answered."""

    def __init__(self, url: str, message: str, status: Optional[int] = None):
        super().__init__(f"sidecar {url}: {message}")
        self.url = url
        self.status = status


class SidecarUnreachable(SidecarError):
    """No answer: connection refused or lost, or timed out, on every attempt (a dead process)."""


class SidecarRefused(SidecarError):
    """The sidecar answered 4xx: the request (or weight load) was refused; the message says why."""


class SidecarMismatch(SidecarError):
    """The sidecar runs with settings this run cannot use (e.g. another logprob definition)."""


_RETRY_STATUS = (502, 503, 504)


class SidecarClient:
    """`types.Generator` over one or more sidecars (see the module docstring).

    Args:
      urls: base URLs, e.g. ["http://127.0.0.1:8001"].
      token / token_file: shared bearer token, sent on every request.
      backend: expected ``backend`` of every sidecar's /health ("jax" or "vllm"); None = any.
      timeout_s: read timeout of one HTTP request (s); connect timeout is `connect_timeout_s`.
      max_retries: further attempts after a transport error or 502/503/504.
      max_prompts_per_request: prompts per HTTP request (a generate call is split into chunks).
      in_flight_updates: accept a completion of any version >= the one expected when its request
        was sent (the sidecar swapped weights between requests); False: exactly the expected one.
    """

    def __init__(self, urls: Sequence[str] | str, *, token: Optional[str] = None, token_file: Optional[str] = None,
                 backend: Optional[str] = None, timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 max_retries: int = 2, retry_backoff_s: float = 0.5, max_prompts_per_request: int = 64,
                 model: str = "policy", max_workers: int = 32, in_flight_updates: bool = False):
        import httpx

        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("SidecarClient: urls must name at least one sidecar")
        if backend not in (None, "jax", "vllm"):
            raise ValueError(f"SidecarClient: backend must be 'jax', 'vllm' or None, got {backend!r}")
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
        self._health: dict[str, dict] = {}
        self._checked: set = set()
        self.expected_version: Optional[int] = None  # set by load_weights
        self.in_flight_updates = in_flight_updates
        self.out_of_rotation: dict[str, str] = {}  # url -> why its last weight load failed (partial_ok)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transport -----------------------------------------------------------------------------
    def _pick(self, exclude: set) -> str:
        with self._lock:
            serving = [u for u in self.urls if u not in self.out_of_rotation] or list(self.urls)
            candidates = [u for u in serving if u not in exclude] or serving
            start = next(self._rr)
            order = candidates[start % len(candidates):] + candidates[:start % len(candidates)]
            url = min(order, key=lambda u: self._in_flight[u])
            self._in_flight[url] += 1
            return url

    def _release(self, url: str) -> None:
        with self._lock:
            self._in_flight[url] -= 1

    def _request(self, method: str, path: str, body: Optional[dict], what: str,
                 url: Optional[str] = None) -> tuple[str, dict]:
        """Sends with retries; returns (url that answered, JSON). `url` pins the sidecar; `what` says
        what the call does, for error messages ("generate 8 completions")."""
        import httpx

        failed: set = set()
        errors = []
        unreachable_only = True
        last_status = None
        for attempt in range(self.max_retries + 1):
            target = url or self._pick(failed)
            try:
                r = self._http.request(method, target + path, json=body)
            except httpx.TransportError as e:
                errors.append(f"{target}: {_transport_words(e)}")
                failed.add(target)
            else:
                if r.status_code == 200:
                    try:
                        return target, r.json()
                    except ValueError:
                        raise SidecarError(target, f"could not {what}: the answer is not JSON: {r.text[:200]!r}",
                                           200) from None
                msg = _error_message(r)
                if 400 <= r.status_code < 500:
                    raise SidecarRefused(target, f"refused to {what} (HTTP {r.status_code}): {msg}", r.status_code)
                if r.status_code not in _RETRY_STATUS:
                    raise SidecarError(target, f"failed to {what} (HTTP {r.status_code}): {msg}", r.status_code)
                errors.append(f"{target}: HTTP {r.status_code}: {msg}")
                unreachable_only = False
                last_status = r.status_code
                failed.add(target)
            finally:
                if url is None:
                    self._release(target)
            if attempt < self.max_retries:
                time.sleep(self.retry_backoff_s * 2 ** attempt)
        names = ", ".join(sorted(failed))
        n = self.max_retries + 1
        if unreachable_only:
            raise SidecarUnreachable(names, f"could not {what}: no answer after {n} attempts ({'; '.join(errors)}); "
                                            "the sidecar process is not running or not reachable from this host")
        raise SidecarError(names, f"could not {what} after {n} attempts: " + "; ".join(errors), last_status)

    # -- checks ---------------------------------------------------------------------------------
    def _health_of(self, url: str) -> dict:
        with self._lock:
            cached = self._health.get(url)
        if cached is not None:
            return cached
        _, h = self._request("GET", "/health", None, "report its health", url=url)
        if self.backend is not None and h.get("backend") != self.backend:
            raise SidecarMismatch(url, f"is a {h.get('backend')!r} sidecar, but this run expects {self.backend!r} "
                                       "(generator.backend)")
        with self._lock:
            self._health[url] = h
        return h

    def check_logprobs_mode(self, params: SamplingParams) -> None:
        """Checks once per sampling setting that every sidecar returns the logprob definition
        `params` asks for (``params.logprobs_mode``, default "full"); greedy settings pass.

        Raises:
          SidecarMismatch: naming the sidecar, the keys and the fix.
          SidecarUnreachable / SidecarError: /health failed.
        """
        mode = params.logprobs_mode
        key = (mode, params.temperature, params.top_p, params.top_k, params.greedy)
        if key in self._checked:
            return
        for url in self.urls:
            info = self._health_of(url).get("logprobs")
            gap = logprob_modes.sidecar_gap(info, mode, params.temperature, params.top_p, params.top_k,
                                            params.greedy)
            if gap is not None:
                raise SidecarMismatch(url, f"cannot return generator.logprobs_mode={mode!r} logprobs at temperature="
                                           f"{params.temperature}, top_p={params.top_p}, top_k={params.top_k}: {gap}. "
                                           f"Fix: {_mode_fix(info, mode, params)}")
        self._checked.add(key)

    # -- generation ----------------------------------------------------------------------------
    def request_body(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> dict:
        """The ``/v1/completions`` body for `prompts` (wire.request_body)."""
        return wire.request_body(prompts, params, self.model)

    def _complete(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        what = f"generate {len(prompts) * params.n} completions"
        sent_expected = self.expected_version
        url, resp = self._request("POST", "/v1/completions", self.request_body(prompts, params), what)
        try:
            out = wire.decode_completion_response(resp, len(prompts), params.n)
        except wire.ProtocolError as e:
            raise SidecarError(url, f"sent an unreadable completions answer: {e}") from e
        expected = self.expected_version
        got = resp.get("policy_version")
        if self.in_flight_updates and sent_expected is not None:
            if not isinstance(got, int) or got < sent_expected:
                raise SidecarError(url, f"served policy version {got}, older than version {sent_expected} every "
                                        "sidecar had loaded when the request was sent; it lost its weights (was it "
                                        "restarted without --resume-latest?)")
        elif expected is not None and got != expected:
            raise SidecarError(url, f"served policy version {got}, but every sidecar was told to load version "
                                    f"{expected}; it lost its weights (was it restarted without --resume-latest?)")
        return out

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `params.n` completions (types.Generator). Thread-safe. Non-finite
        logprobs come back as NaN (the caller validates engine output).

        Raises:
          SidecarMismatch: a sidecar cannot return the logprob definition `params` asks for.
          SidecarRefused: a sidecar refused the request (4xx; e.g. over its limits).
          SidecarUnreachable / SidecarError: every attempt failed (names the URL).
        """
        if not prompts:
            return []
        self.check_logprobs_mode(params)
        k = self.max_prompts_per_request
        chunks = [prompts[i:i + k] for i in range(0, len(prompts), k)]
        if len(chunks) == 1:
            return self._complete(chunks[0], params)
        futures = [self._pool.submit(self._complete, c, wire.chunk_params(params, i)) for i, c in enumerate(chunks)]
        return [g for f in futures for g in f.result()]

    # -- control -------------------------------------------------------------------------------
    def health(self) -> dict[str, dict]:
        """{url: the sidecar's /health JSON}, fetched now.

        Raises:
          SidecarUnreachable / SidecarError: naming the sidecar that did not answer 200.
        """
        return {u: self._request("GET", "/health", None, "report its health", url=u)[1] for u in self.urls}

    def load_weights(self, version: int, path: str, partial_ok: bool = False) -> dict[str, dict]:
        """Has every sidecar load committed version `version` at `path`; returns {url: answer}.

        Each sidecar answers only after its engine (for vLLM: every worker) reports `version`;
        the client checks the answer too. Afterwards completions of any other version are refused.
        With `partial_ok`, a sidecar whose load fails is taken out of rotation (`out_of_rotation`
        names it and the error; the answer omits it) and one whose load succeeds is put back; the
        call raises only when no sidecar loaded `version`.

        Raises:
          SidecarUnreachable: a sidecar did not answer (dead, or killed during the load).
          SidecarRefused: a sidecar refused the load (wrong token, path outside its sync directory,
            version mismatch).
          SidecarError: the load failed in the sidecar, or it reports another version.
        """
        futures = {u: self._pool.submit(self._load_one, u, int(version), path) for u in self.urls}
        if not partial_ok:
            out = {u: f.result() for u, f in futures.items()}
            self.expected_version = int(version)
            return out
        out, failed = {}, {}
        for u, f in futures.items():
            try:
                out[u] = f.result()
            except SidecarError as e:
                failed[u] = e
        if not out:
            raise next(iter(failed.values()))
        with self._lock:
            self.out_of_rotation = {u: str(e) for u, e in failed.items()}
        self.expected_version = int(version)
        return out

    def _load_one(self, url: str, version: int, path: str) -> dict:
        _, resp = self._request("POST", "/v1/load_weights", {"version": version, "path": path},
                                f"load policy version {version} from {path}", url=url)
        if resp.get("policy_version") != version:
            raise SidecarError(url, f"reports policy version {resp.get('policy_version')} after loading {version}")
        return resp


def _mode_fix(info, mode: str, params: SamplingParams) -> str:
    if isinstance(info, dict) and info.get("backend") == "vllm":
        try:
            need = logprob_modes.vllm_mode_for(mode, params.temperature, params.top_p, params.top_k)
        except ValueError:
            return ("no vLLM mode returns full-vocabulary logprobs at this temperature with top-p/top-k on; use "
                    "generator.logprobs_mode=sampled, temperature 1, or top_p=1 and top_k=-1")
        return f"restart the vLLM sidecar with JAXRL_VLLM_LOGPROBS_MODE={need} (launch/vllm_sidecar.sh)"
    return "update the sidecar to this version of jaxrl, or use generator.logprobs_mode=full"


def _transport_words(e) -> str:
    import httpx

    if isinstance(e, httpx.ConnectError):
        return f"connection refused or host unreachable ({e})" if str(e) else "connection refused or host unreachable"
    if isinstance(e, httpx.TimeoutException):
        return f"timed out ({type(e).__name__})"
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return "connection lost while waiting for the answer (did the sidecar process die?)"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _error_message(r) -> str:
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
    return str(body)[:500]
