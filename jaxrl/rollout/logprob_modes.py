"""Which logprob definition an engine returns, and whether that is the one a run asked for.

A run picks one definition (`generator.logprobs_mode`, recorded in rl_config.json):

* ``"full"`` (docs/architecture.md §3): log softmax(logits / T)[token] over the whole vocabulary, without
  top-p/top-k renormalisation: the same quantity the trainer computes for π_old.
* ``"sampled"``: the log-probability under the distribution actually sampled: logits / T, then
  top-k and top-p masking, then log softmax over the kept tokens (renormalised). This is the true
  behaviour policy μ when top-p/top-k are on; the trainer's π_old stays "full", so the importance
  ratio π_old / μ then measures the truncation too (TIS corrects for it).
* ``"raw"``: log softmax(logits)[token] at temperature 1 over the whole vocabulary, whatever the
  sampling settings: vLLM's default ``raw_logprobs``, what the seed runs' vLLM returned while their
  trainer used logits / T (the ratio then measures the temperature too).

The JAX engine delivers either per request. vLLM has one engine-wide ``--logprobs-mode``; from
its source (``vllm/v1/sample/sampler.py``, ``vllm/v1/sample/ops/topk_topp_sampler.py``, and the
``vllm/v1/worker/gpu/sample/sampler.py`` of the newer model runner), for the modes jaxrl uses:

* ``raw_logprobs`` (vLLM's default): log_softmax of the model's logits in float32, taken *before*
  penalties, temperature and top-k/top-p. Equals "full" only at T = 1 (and "sampled" only at
  T = 1 with no top-p/top-k).
* ``processed_logprobs``: log_softmax of the logits after penalties, temperature, min_p and the
  top-k/top-p masking (masked tokens at -inf), i.e. renormalised over the kept set. Equals
  "sampled" always, and "full" when top-p/top-k are off (then nothing is masked).

So "full" with T != 1 *and* top-p/top-k on has no vLLM mode, and is refused. Greedy requests
(evaluation) are exempt: their logprobs are informational (vLLM returns log_softmax(logits)).
jaxrl never sends penalties or min_p (wire.py refuses them), so they play no part here.
"""
from __future__ import annotations

from typing import Any, Optional

VLLM_MODES = ("processed_logprobs", "raw_logprobs")


def filters_active(top_p: float, top_k: int) -> bool:
    """True when top-p or top-k removes tokens (top_p < 1 or top_k > 0)."""
    return top_p < 1.0 or top_k > 0


def vllm_gap(vllm_mode: str, logprobs_mode: str, temperature: float, top_p: float, top_k: int) -> Optional[str]:
    """None when vLLM started with ``--logprobs-mode vllm_mode`` returns the `logprobs_mode`
    definition for these sampling settings; otherwise the reason, in words.

    Raises:
      ValueError: an unknown vLLM mode or logprobs mode.
    """
    if logprobs_mode not in ("full", "sampled", "raw"):
        raise ValueError(f"unknown logprobs mode {logprobs_mode!r}; use 'full', 'sampled' or 'raw'")
    filt = filters_active(top_p, top_k)
    if logprobs_mode == "raw":
        if vllm_mode == "raw_logprobs":
            return None
        if vllm_mode == "processed_logprobs":
            if temperature != 1.0 or filt:
                return (f"vLLM's processed_logprobs are taken after temperature and top-p/top-k "
                        f"(temperature={temperature}, top_p={top_p}, top_k={top_k})")
            return None
        raise ValueError(f"unknown vLLM logprobs mode {vllm_mode!r}; jaxrl uses one of {list(VLLM_MODES)}")
    if vllm_mode == "processed_logprobs":
        if logprobs_mode == "full" and filt:
            return (f"vLLM's processed_logprobs renormalise over the top-p/top-k kept set (top_p={top_p}, "
                    f"top_k={top_k}), not over the full vocabulary")
        return None
    if vllm_mode == "raw_logprobs":
        if temperature != 1.0:
            return f"vLLM's raw_logprobs are taken before temperature scaling (temperature={temperature})"
        if logprobs_mode == "sampled" and filt:
            return f"vLLM's raw_logprobs are taken before top-p/top-k (top_p={top_p}, top_k={top_k})"
        return None
    raise ValueError(f"unknown vLLM logprobs mode {vllm_mode!r}; jaxrl uses one of {list(VLLM_MODES)}")


def vllm_mode_for(logprobs_mode: str, temperature: float, top_p: float, top_k: int) -> str:
    """The vLLM ``--logprobs-mode`` that delivers `logprobs_mode` at these settings
    (processed_logprobs preferred).

    Raises:
      ValueError: no vLLM mode delivers it ("full" at temperature != 1 with top-p/top-k on); the
        message says why.
    """
    reasons = []
    for m in VLLM_MODES:
        gap = vllm_gap(m, logprobs_mode, temperature, top_p, top_k)
        if gap is None:
            return m
        reasons.append(gap)
    raise ValueError(f"no vLLM logprobs mode returns {logprobs_mode!r} logprobs here: " + "; ".join(reasons))


def sidecar_gap(info: Any, logprobs_mode: str, temperature: float, top_p: float, top_k: int,
                greedy: bool = False) -> Optional[str]:
    """None when a sidecar whose ``/health`` reports ``logprobs = info`` returns the `logprobs_mode`
    definition for these settings; otherwise the reason. Greedy requests always pass.

    `info` is ``{"backend": "jax", "modes": [...]}`` (modes served per request) or
    ``{"backend": "vllm", "vllm_logprobs_mode": "..."}``.
    """
    if greedy:
        return None
    if not isinstance(info, dict):
        return "the sidecar does not report its logprob mode (a sidecar older than this client?)"
    if info.get("backend") == "vllm":
        mode = info.get("vllm_logprobs_mode")
        if mode not in VLLM_MODES:
            return f"the vLLM sidecar reports an unusable logprobs mode {mode!r}"
        return vllm_gap(mode, logprobs_mode, temperature, top_p, top_k)
    modes = info.get("modes") or []
    if logprobs_mode not in modes:
        return f"the engine serves logprobs modes {modes}, not {logprobs_mode!r}"
    return None
