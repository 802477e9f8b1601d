"""Data types shared by every rollout backend (JAX engine, sidecar client, vLLM).

Generation is token-in / token-out (DESIGN.md §1, §3): a request carries prompt token ids, a
completion carries the exact sampled token ids and their logprobs. Nothing here re-tokenizes.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Protocol, Sequence

# Values of `SamplingParams.logprobs_mode`.
LOGPROBS_MODES = ("full", "sampled")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request.

    Attributes:
      max_tokens: maximum number of new tokens (the stop token counts as one). Must be >= 1.
      temperature: softmax temperature (> 0). Logprobs are log softmax(logits / temperature)
        of the sampled token, float32, without top-p/top-k renormalisation (DESIGN.md §3) unless
        `logprobs_mode` is "sampled".
      top_p: nucleus mass in (0, 1]; 1.0 disables it.
      top_k: keep the k most likely tokens; 0 or -1 disables it.
      stop_token_ids: generation of a row ends right after it samples one of these ids (included
        in the output, finish_reason "stop").
      n: samples per prompt.
      seed: per-request seed; the same seed, prompt and weights give the same tokens, whatever
        else is in the batch.
      greedy: argmax decoding (logprobs still use `temperature`).
      logprobs_mode: which log-probability each completion reports for its tokens (float32):
        ``"full"`` (default, DESIGN.md §3): log softmax(logits / temperature) over the full
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
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"SamplingParams.temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"SamplingParams.logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")


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
