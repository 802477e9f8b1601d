"""Data types shared by every rollout backend (JAX engine, sidecar client, vLLM).

Generation is token-in / token-out (docs/architecture.md §1, §3): a request carries prompt token ids, a
completion carries the exact sampled token ids and their logprobs. Nothing here re-tokenizes.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import TYPE_CHECKING, Optional, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:  # weight_sync imports numpy/orbax lazily; only its type is named here
    from jaxrl.rollout.weight_sync import SyncStats


MIN_TEMPERATURE = 1e-2
"""Smallest sampling temperature. Below it logits / temperature can overflow float32 (NaN logprobs in
a float32 log-softmax) and sampling is argmax in all but name; use `greedy=True` (temperature 0
over HTTP) for argmax decoding. vLLM raises temperatures below 0.01 to 0.01 for the same reason."""


_FLOAT32_MAX = float(np.finfo(np.float32).max)  # engines divide logits by the temperature in float32


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# Values of `SamplingParams.logprobs_mode`.
LOGPROBS_MODES = ("full", "sampled", "raw")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request, validated on construction (every backend and the sidecar's
    HTTP layer build one, so bad values stop here with a one-line ValueError naming the field).

    Attributes:
      max_tokens: maximum number of new tokens (the stop token counts as one). Integer >= 1.
      temperature: softmax temperature, finite in float32, >= `MIN_TEMPERATURE` (0.01). Logprobs are
        log softmax(logits / temperature) of the sampled token, float32, without top-p/top-k
        renormalisation (docs/architecture.md §3), unless `logprobs_mode` is "sampled".
      top_p: nucleus mass in (0, 1]; 1.0 disables it. The most likely token is always kept, so a
        tiny top_p is greedy sampling, never an empty set.
      top_k: keep the k most likely tokens; 0 or -1 disables it. Integer >= -1.
      stop_token_ids: generation of a row ends right after it samples one of these ids (included
        in the output, finish_reason "stop"). Integers >= 0.
      n: samples per prompt. Integer >= 1.
      seed: per-request seed (an integer; engines use it modulo 2**32), or None; the same seed,
        prompt and weights give the same tokens, whatever else is in the batch.
      greedy: argmax decoding (logprobs still use `temperature`).
      logprobs_mode: which log-probability each completion reports for its tokens (float32):
        ``"full"`` (default, docs/architecture.md §3): log softmax(logits / temperature) over the full
        vocabulary, the trainer's definition; ``"sampled"``: the log-probability under the
        distribution actually sampled, i.e. after temperature, top-k and top-p, renormalised over
        the kept set (vLLM's ``processed_logprobs``; for greedy rows the same filtered
        distribution). Without top-p/top-k the two are equal.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: Optional[int] = None
    greedy: bool = False
    logprobs_mode: str = "full"

    def __post_init__(self):
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or not MIN_TEMPERATURE <= self.temperature <= _FLOAT32_MAX:
            raise ValueError(f"SamplingParams.temperature must be a finite (float32) number >= {MIN_TEMPERATURE}, got "
                             f"{self.temperature!r}; for argmax decoding use greedy=True (temperature 0 over HTTP)")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be an integer >= -1 (0 or -1 disables it), got {self.top_k!r}")
        if not isinstance(self.stop_token_ids, (tuple, list)) or not all(
                _is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids must be a tuple of integers >= 0, got "
                             f"{self.stop_token_ids!r}")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an integer >= 1, got {self.n!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"SamplingParams.seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.greedy, (bool, np.bool_)):
            raise ValueError(f"SamplingParams.greedy must be True or False, got {self.greedy!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"SamplingParams.logprobs_mode must be one of {LOGPROBS_MODES}, "
                             f"got {self.logprobs_mode!r}")


@dataclasses.dataclass
class Completion:
    """One sampled continuation.

    Attributes:
      token_ids: generated ids, stop token included when finish_reason == "stop".
      logprobs: float32 logprob of each generated id under the sampling temperature, same length.
      finish_reason: "stop" (a stop token was sampled) or "length" (max_tokens reached).
      policy_version: version of the weights that produced it (0 = the initial checkpoint).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int = 0


class Generator(Protocol):
    """What the environment loop needs from a rollout backend (sidecar client or in-process)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """Returns, for each prompt, `params.n` completions."""
        ...


# A request for an engine: prompts (token ids) and the sampling settings they share.
EngineRequest = tuple[Sequence[Sequence[int]], SamplingParams]


class Engine(Protocol):
    """What the sidecar server needs from an in-process generation engine (the JAX `Sampler`).

    Attributes:
      policy_version: version of the weights currently loaded (0 = initial checkpoint).
      eos_token_ids: ids added to a request's stop ids unless it sets ``ignore_eos`` (may be empty).
    """

    policy_version: int
    eos_token_ids: tuple[int, ...]

    def generate_requests(self, requests: Sequence[EngineRequest]) -> list[list[list[Completion]]]:
        """One batched call: for each request, for each prompt, `params.n` completions.

        Raises ValueError for a request the engine cannot serve (the server answers 400)."""
        ...

    def load_version(self, version_dir: str, version: int) -> "SyncStats":
        """Replaces the weights by the committed version in `version_dir`; sets policy_version.
        Must leave the old weights in place when it raises."""
        ...
