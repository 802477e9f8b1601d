"""The sidecar's HTTP wire format, used by both ends (server parses and answers, client builds and
decodes), so that the two can never drift apart.

``POST /v1/completions`` is the token-in/token-out subset of the OpenAI completions API that vLLM's
OpenAI-compatible server also speaks (docs/sidecar.md):

* request: ``prompt`` as token ids (a list of ints, or a list of lists of ints), ``max_tokens``,
  ``temperature`` (0 = greedy, as in vLLM), ``top_p``, ``top_k`` (vLLM extra; -1 or 0 = off),
  ``n``, ``seed``, ``stop_token_ids`` and ``ignore_eos`` (vLLM extras), ``logprobs`` (0 = the
  sampled token's logprob only; the only value served), ``return_token_ids`` (vLLM extra).
  jaxrl extensions: ``greedy`` (argmax decoding with logprobs at ``temperature``) and
  ``logprobs_mode`` ("full" = log softmax(logits / T) over the whole vocabulary, docs/architecture.md §3;
  "sampled" = log-probability under the distribution actually sampled, after top-k/top-p,
  renormalised; "raw" = log softmax(logits) at temperature 1, vLLM's default raw_logprobs). Fields whose semantics this sidecar does not implement (text prompts,
  ``stream``, stop strings, penalties, ``min_p``, ``logit_bias``, ``best_of`` > 1, ``echo``,
  ``suffix``, ``prompt_logprobs``, ``min_tokens``) are refused with 400, never ignored.
* response: OpenAI's ``text_completion`` object; choices are ordered prompt-major (index =
  prompt * n + sample, as vLLM does); each choice has ``token_ids`` and ``prompt_token_ids`` (vLLM's
  ``return_token_ids``), ``logprobs = {tokens, token_logprobs, top_logprobs, text_offset}`` with
  tokens rendered ``"token_id:<id>"`` (vLLM's ``return_tokens_as_token_ids`` form) and ``text`` "".
  jaxrl extension: ``policy_version`` (the weights that produced the completions).
  **Non-finite logprobs are sent as JSON ``null``** (JSON has no NaN; vLLM clamps -inf to -9999.0,
  which this format also reads as non-finite); the client turns null back into NaN, so that the
  trainer's validation of engine output sees it.

Limits (`RequestLimits`): every request is bounded in samples per prompt, prompts, rows
(prompts x n), prompt tokens, total tokens and body bytes; a request over a limit gets a 4xx that
names the limit and the server flag that raises it.
"""
from __future__ import annotations

import dataclasses
import math
import time
import uuid
from typing import Any, Optional, Sequence

from jaxrl.rollout.types import LOGPROBS_MODES, MIN_TEMPERATURE, Completion, SamplingParams

# vLLM (like OpenAI) reports a -inf logprob as -9999.0; values at or below it are not real logprobs.
LOGPROB_FLOOR = -9999.0
_INT64 = 2**63


class RequestError(ValueError):
    """A request the sidecar refuses; `status` is the HTTP status (400, or 413 for a body over the
    size limit); the message names the field or limit and what to send instead."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class ProtocolError(ValueError):
    """A response that does not follow this wire format (the client wraps it in a SidecarError)."""


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """Per-request bounds of a sidecar (server flags in parentheses).

    Attributes:
      max_n: samples per prompt (``--max-n``).
      max_prompts: prompts per request (``--max-prompts``).
      max_rows: prompts x n per request (``--max-rows``).
      max_prompt_tokens: tokens of one prompt (``--max-prompt-tokens``).
      max_total_tokens: sum over rows of prompt tokens + max_tokens, i.e. the request's worst-case
        token work (``--max-total-tokens``).
      max_body_bytes: size of the JSON body (``--max-body-bytes``).
    """

    max_n: int = 256
    max_prompts: int = 1024
    max_rows: int = 4096
    max_prompt_tokens: int = 32768
    max_total_tokens: int = 1 << 25
    max_body_bytes: int = 64 << 20

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"RequestLimits.{f.name} must be >= 1, got {getattr(self, f.name)}")


@dataclasses.dataclass
class ParsedRequest:
    """A validated completions request: prompts, the sampling params they share, response options."""

    prompts: list[list[int]]
    params: SamplingParams
    model: str = "policy"
    return_token_ids: bool = True
    logprobs: Optional[int] = 0
    ignore_eos: bool = False  # the request's own flag (eos ids were already added to params' stop ids)


def derive_seed(seed: int, index: int) -> int:
    """A seed for part `index` of a request with seed `seed` (chunks of a split request, prompts
    sent to vLLM one by one): different parts never share a random stream. In [0, 2**31)."""
    return (int(seed) * 1_000_003 + 7919 * (index + 1)) % 2**31


def chunk_params(params: SamplingParams, chunk_index: int) -> SamplingParams:
    """The sampling params of chunk `chunk_index` of a split request (seed from `derive_seed`)."""
    if params.seed is None:
        return params
    return dataclasses.replace(params, seed=derive_seed(params.seed, chunk_index))


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(body: dict, name: str, default, kind):
    v = body.get(name)
    if v is None:
        return default
    if kind is int and not _is_int(v):
        raise RequestError(f"{name}: expected an integer, got {v!r}")
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RequestError(f"{name}: expected a number, got {v!r}")
        if not math.isfinite(v):
            raise RequestError(f"{name}: expected a finite number, got {v!r}")
    return kind(v)


# Fields whose semantics are not implemented: (name, value that means "off", what to send).
_UNSUPPORTED = (
    ("stream", False, "streaming is not supported; send stream=false"),
    ("stop", None, "stop strings are not supported (token-out sidecar); use stop_token_ids"),
    ("echo", False, "echo is not supported; the prompt comes back as prompt_token_ids"),
    ("suffix", None, "suffix is not supported"),
    ("best_of", 1, "best_of is not supported; send n samples and choose on the client"),
    ("presence_penalty", 0, "penalties are not supported (they would change the logprob definition); send 0"),
    ("frequency_penalty", 0, "penalties are not supported (they would change the logprob definition); send 0"),
    ("repetition_penalty", 1, "penalties are not supported (they would change the logprob definition); send 1"),
    ("min_p", 0, "min_p is not supported; use top_p or top_k"),
    ("logit_bias", None, "logit_bias is not supported"),
    ("prompt_logprobs", None, "prompt_logprobs is not supported"),
    ("min_tokens", 0, "min_tokens is not supported"),
)


def parse_completion_request(body: Any, eos_token_ids: Sequence[int] = (),
                             limits: RequestLimits = RequestLimits()) -> ParsedRequest:
    """Validates a ``/v1/completions`` JSON body (module docstring) against `limits`.

    Args:
      body: the decoded JSON.
      eos_token_ids: ids appended to ``stop_token_ids`` unless the request sets ``ignore_eos``.
      limits: the sidecar's request limits.
    Returns:
      The `ParsedRequest`; ``params.seed`` is None when the request has no seed.
    Raises:
      RequestError: naming the offending field or limit and what to send instead.
    """
    if not isinstance(body, dict):
        raise RequestError("body: expected a JSON object")
    for name, off, advice in _UNSUPPORTED:
        v = body.get(name)
        if v is not None and v != off and not (off is None and v in ([], {}, "")):
            raise RequestError(f"{name}: {advice} (got {v!r})")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [prompt]
    elif (isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt)
          and all(_is_int(t) for p in prompt for t in p)):
        prompts = prompt
    else:
        raise RequestError("prompt: this sidecar is token-in only; send a non-empty list of token ids "
                           "or a list of non-empty lists of token ids (text prompts are not accepted)")
    if any(t < 0 for p in prompts for t in p):
        raise RequestError("prompt: token ids must be >= 0")

    temperature = _num(body, "temperature", 1.0, float)
    greedy = body.get("greedy", False)
    if not isinstance(greedy, bool):
        raise RequestError(f"greedy: expected true or false, got {greedy!r}")
    if temperature == 0.0:  # vLLM's convention: temperature 0 = greedy
        greedy, temperature = True, 1.0
    elif temperature < MIN_TEMPERATURE:
        raise RequestError(f"temperature: {temperature} is outside [{MIN_TEMPERATURE}, inf) (logits / temperature "
                           "would overflow); send 0 for greedy decoding or a temperature >= "
                           f"{MIN_TEMPERATURE}")
    top_p = _num(body, "top_p", 1.0, float)
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"top_p: {top_p} is outside (0, 1]; send 1 to disable nucleus sampling")
    top_k = _num(body, "top_k", -1, int)
    if top_k < -1:
        raise RequestError(f"top_k: {top_k} is not a valid top-k; send -1 (or 0) to disable it, or k >= 1")
    max_tokens = _num(body, "max_tokens", 16, int)
    if max_tokens < 1:
        raise RequestError(f"max_tokens: {max_tokens} must be >= 1")
    n = _num(body, "n", 1, int)
    if n < 1:
        raise RequestError(f"n: {n} must be >= 1")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -_INT64 <= seed < _INT64):
        raise RequestError(f"seed: expected a 64-bit integer or null, got {seed!r}")
    stop = body.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(_is_int(t) and t >= 0 for t in stop):
        raise RequestError(f"stop_token_ids: expected a list of non-negative integers, got {stop!r}")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(f"ignore_eos: expected true or false, got {ignore_eos!r}")
    if not ignore_eos:
        stop = list(stop) + [t for t in eos_token_ids if t not in stop]
    logprobs = body.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or logprobs != 0):
        raise RequestError(f"logprobs: this sidecar returns the sampled token's logprob only; send logprobs=0 "
                           f"(got {logprobs!r})")
    mode = body.get("logprobs_mode", "full")
    if mode not in LOGPROBS_MODES:
        raise RequestError(f"logprobs_mode: expected one of {list(LOGPROBS_MODES)}, got {mode!r}")
    return_token_ids = body.get("return_token_ids", False)
    if not isinstance(return_token_ids, bool):
        raise RequestError(f"return_token_ids: expected true or false, got {return_token_ids!r}")
    model = body.get("model") or "policy"
    if not isinstance(model, str):
        raise RequestError(f"model: expected a string, got {model!r}")

    # Limits: checked before any work is queued.
    if n > limits.max_n:
        raise RequestError(f"n: {n} samples per prompt exceed this sidecar's limit of {limits.max_n} "
                           "(server flag --max-n); split the request")
    if len(prompts) > limits.max_prompts:
        raise RequestError(f"prompt: {len(prompts)} prompts exceed this sidecar's limit of {limits.max_prompts} "
                           "per request (server flag --max-prompts); split the request")
    if len(prompts) * n > limits.max_rows:
        raise RequestError(f"n: {len(prompts)} prompts x n={n} = {len(prompts) * n} samples exceed this sidecar's "
                           f"limit of {limits.max_rows} per request (server flag --max-rows); split the request")
    longest = max(len(p) for p in prompts)
    if longest > limits.max_prompt_tokens:
        raise RequestError(f"prompt: a prompt of {longest} tokens exceeds this sidecar's limit of "
                           f"{limits.max_prompt_tokens} (server flag --max-prompt-tokens)")
    total = sum(n * (len(p) + max_tokens) for p in prompts)
    if total > limits.max_total_tokens:
        raise RequestError(f"max_tokens: the request's total of {total} tokens (n x (prompt tokens + max_tokens), "
                           f"summed over prompts) exceeds this sidecar's limit of {limits.max_total_tokens} "
                           "(server flag --max-total-tokens); split the request or lower max_tokens")

    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
                                stop_token_ids=tuple(stop), n=n, seed=seed, greedy=greedy, logprobs_mode=mode)
    except ValueError as e:  # SamplingParams' own range checks
        raise RequestError(str(e)) from e
    return ParsedRequest(prompts=prompts, params=params, model=model, return_token_ids=return_token_ids,
                         logprobs=logprobs, ignore_eos=ignore_eos)


def request_body(prompts: Sequence[Sequence[int]], params: SamplingParams, model: str = "policy") -> dict:
    """The ``/v1/completions`` body the client sends for `prompts` (module docstring).

    ``ignore_eos`` is set: the stop ids are exactly ``params.stop_token_ids``. ``greedy`` keeps the
    request's temperature for the logprobs; the ``logprobs_mode`` extension is sent when it is not
    the default "full".
    """
    body = {"model": model, "prompt": [list(map(int, p)) for p in prompts], "max_tokens": int(params.max_tokens),
            "temperature": float(params.temperature), "top_p": float(params.top_p),
            "top_k": int(params.top_k) if params.top_k > 0 else -1, "n": int(params.n),
            "stop_token_ids": [int(t) for t in params.stop_token_ids], "ignore_eos": True, "logprobs": 0,
            "return_token_ids": True}
    if params.seed is not None:
        body["seed"] = int(params.seed)
    if params.greedy:
        body["greedy"] = True
    if params.logprobs_mode != "full":
        body["logprobs_mode"] = params.logprobs_mode
    return body


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------

def encode_logprob(x: float) -> Optional[float]:
    """A logprob for JSON: a finite float, or None (JSON null) for NaN, +-inf and values at or
    below vLLM's -9999.0 encoding of -inf."""
    x = float(x)
    return x if math.isfinite(x) and x > LOGPROB_FLOOR else None


def decode_logprob(x: Any) -> float:
    """The inverse of `encode_logprob`: null (and -9999.0 or below) becomes NaN.

    Raises:
      ProtocolError: `x` is neither a number nor null.
    """
    if x is None:
        return math.nan
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ProtocolError(f"a logprob must be a number or null, got {x!r}")
    x = float(x)
    return x if math.isfinite(x) and x > LOGPROB_FLOOR else math.nan


def completion_response(request: ParsedRequest, results: Sequence[Sequence[Completion]],
                        policy_version: Optional[int]) -> dict:
    """The ``text_completion`` response for `request` (module docstring); JSON-safe (no NaN)."""
    choices = []
    n_gen = 0
    for prompt, comps in zip(request.prompts, results):
        for c in comps:
            n_gen += len(c.token_ids)
            lp = None
            if request.logprobs is not None:
                toks = [f"token_id:{int(t)}" for t in c.token_ids]
                vals = [encode_logprob(x) for x in c.logprobs]
                lp = {"text_offset": [0] * len(toks), "token_logprobs": vals, "tokens": toks,
                      "top_logprobs": [{t: v} for t, v in zip(toks, vals)]}
            choice = {"index": len(choices), "text": "", "logprobs": lp, "finish_reason": c.finish_reason,
                      "stop_reason": int(c.token_ids[-1]) if c.finish_reason == "stop" and c.token_ids else None}
            if request.return_token_ids:
                choice["token_ids"] = [int(t) for t in c.token_ids]
                choice["prompt_token_ids"] = [int(t) for t in prompt]
            choices.append(choice)
    n_prompt = sum(len(p) for p in request.prompts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": request.model, "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen},
            "policy_version": policy_version}


def decode_completion_response(resp: Any, num_prompts: int, n: int,
                               default_version: Optional[int] = None) -> list[list[Completion]]:
    """Completions from a ``/v1/completions`` response: per prompt, `n` of them, in choice order.

    Non-finite logprobs (null on the wire) come back as NaN; ``policy_version`` falls back to
    `default_version` when the response has none.

    Raises:
      ProtocolError: wrong number of choices, missing token ids or logprobs, lengths that differ.
    """
    if not isinstance(resp, dict) or not isinstance(resp.get("choices"), list):
        raise ProtocolError("the response is not a completions object (no 'choices' list)")
    choices = resp["choices"]
    if len(choices) != num_prompts * n:
        raise ProtocolError(f"expected {num_prompts * n} choices ({num_prompts} prompts x n={n}), got {len(choices)}")
    try:
        choices = sorted(choices, key=lambda c: int(c["index"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"a choice lacks an integer 'index' ({e})") from e
    version = resp.get("policy_version", default_version)
    out = []
    for i in range(num_prompts):
        group = []
        for c in choices[i * n:(i + 1) * n]:
            toks, lp = c.get("token_ids"), c.get("logprobs")
            if not isinstance(toks, list) or not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
                raise ProtocolError("a choice lacks token_ids or logprobs.token_logprobs; the server must support "
                                    "return_token_ids and logprobs=0 (vLLM >= 0.10.2 behind the jaxrl front)")
            if len(lp["token_logprobs"]) != len(toks) or not all(_is_int(t) for t in toks):
                raise ProtocolError(f"choice {c['index']}: {len(toks)} token ids but "
                                    f"{len(lp['token_logprobs'])} logprobs")
            if c.get("finish_reason") not in ("stop", "length"):
                raise ProtocolError(f"choice {c['index']}: unknown finish_reason {c.get('finish_reason')!r}")
            group.append(Completion(token_ids=list(toks), logprobs=[decode_logprob(x) for x in lp["token_logprobs"]],
                                    finish_reason=c["finish_reason"],
                                    policy_version=int(version) if version is not None else 0))
        out.append(group)
    return out
