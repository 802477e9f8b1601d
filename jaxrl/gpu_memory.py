"""GPU memory shares: every process on a GPU host claims an explicit fraction of each GPU.

JAX preallocates a fraction of every visible GPU when its backend starts (XLA's BFC allocator;
``XLA_PYTHON_CLIENT_MEM_FRACTION``, default 0.75, is also its cap) and vLLM claims
``--gpu-memory-utilization`` of each of its GPUs. With the defaults, a trainer and a sidecar on the
same GPU split the memory by accident (an H200 run: the trainer took 108 GB, the sidecar the 34 GB
left, which at 8B would not hold the engine). So the shares are config keys, set in each process's
environment, and validated before anything starts:

* ``trainer.gpu_memory_fraction``: each trainer process (XLA memory fraction, preallocated).
* ``generator.gpu_memory_utilization``: each sidecar engine on the trainer's GPUs: a JAX sidecar's
  XLA memory fraction (every JAX sidecar the trainer starts sees all the host's GPUs and claims
  this share of each), or, for external sidecars (``generator.sidecar_urls``) that
  ``generator.colocate_with_trainer`` puts on the trainer's GPUs, vLLM's
  ``--gpu-memory-utilization`` (launch/vllm_sidecar.sh's ``JAXRL_GPU_MEMORY_UTILIZATION``) or an
  external JAX sidecar's XLA fraction; the trainer checks what each external sidecar reports.

The sum on one GPU must leave `RESERVE` free (CUDA contexts, cuDNN/cuBLAS workspaces and NCCL
buffers live outside those pools). On CPU the shares have no effect and are not enforced.
"""
from __future__ import annotations

import os
from typing import Mapping, MutableMapping, Optional

from jaxrl.errors import ConfigError

RESERVE = 0.05  # fraction of each GPU left outside every pool
FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"


def claims(c) -> list[tuple[str, float]]:
    """The claims on one GPU of the trainer's host: [(who, fraction)], trainer first."""
    g = c.generator
    out = [("trainer (trainer.gpu_memory_fraction)", float(c.trainer.gpu_memory_fraction))]
    if g.backend == "jax" and not g.sidecar_urls:  # sidecars the trainer starts on its own host
        out += [(f"JAX sidecar {i} (generator.gpu_memory_utilization)", float(g.gpu_memory_utilization))
                for i in range(int(g.num_sidecars))]
    elif g.colocate_with_trainer:  # one external engine per GPU next to the trainer
        out.append((f"{'vLLM' if g.backend == 'vllm' else 'JAX'} sidecar (generator.gpu_memory_utilization)",
                    float(g.gpu_memory_utilization)))
    return out


def check_keys(c) -> None:
    """Range checks of the share keys (any platform): their Fields' check (jaxrl/config/schema.py,
    bounds (0, 1)), the one check of these keys.

    Raises:
      ConfigError: a share outside (0, 1).
    """
    from jaxrl.config.schema import FIELDS_BY_KEY, get_value

    for key in ("trainer.gpu_memory_fraction", "generator.gpu_memory_utilization"):
        f = FIELDS_BY_KEY[key]
        problem = f.problem_with(get_value(c, key))
        if problem:
            raise ConfigError(key, problem, f.fix_text())


def check_shares(c) -> None:
    """Checks that the claims on one GPU leave `RESERVE` free.

    Raises:
      ConfigError: naming each claim, their sum and the limit.
    """
    check_keys(c)
    parts = claims(c)
    total = sum(f for _, f in parts)
    if total > 1.0 - RESERVE + 1e-9:
        listing = " + ".join(f"{f:.2f} {who}" for who, f in parts)
        raise ConfigError("trainer.gpu_memory_fraction", f"the processes on one GPU claim {listing} = {total:.2f} "
                          f"of its memory, more than {1 - RESERVE:.2f} (1 - {RESERVE} kept for CUDA contexts and "
                          "workspaces)", "lower trainer.gpu_memory_fraction or generator.gpu_memory_utilization "
                          "(or run fewer sidecars / put vLLM on its own nodes)")


def trainer_env(c) -> dict[str, str]:
    """Environment of a trainer process: its XLA memory fraction, preallocated."""
    return {FRACTION_ENV: f"{float(c.trainer.gpu_memory_fraction):g}", PREALLOCATE_ENV: "true"}


def sidecar_env(c) -> dict[str, str]:
    """Environment of a JAX sidecar process the trainer starts."""
    return {FRACTION_ENV: f"{float(c.generator.gpu_memory_utilization):g}", PREALLOCATE_ENV: "true"}


def apply_trainer_env(c, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Sets the trainer's share in `environ` (default os.environ); call before JAX's backend starts.

    Raises:
      ConfigError: the environment already sets a different fraction (it would be ignored silently
        otherwise).
    """
    environ = os.environ if environ is None else environ
    want = trainer_env(c)
    have = environ.get(FRACTION_ENV)
    if have is not None and have.strip() and abs(float(have) - float(want[FRACTION_ENV])) > 1e-9:
        raise ConfigError("trainer.gpu_memory_fraction", f"{FRACTION_ENV}={have} in the environment disagrees with "
                          f"trainer.gpu_memory_fraction={want[FRACTION_ENV]}",
                          f"unset {FRACTION_ENV} and set the config key instead")
    environ.update(want)


def check_external_sidecars(c, health: Mapping[str, dict]) -> None:
    """With external sidecars on the trainer's GPUs (``generator.colocate_with_trainer``), every
    sidecar must claim the configured share (vLLM's utilization or a JAX sidecar's XLA fraction).

    Args:
      health: {url: /health JSON} of the sidecars.
    Raises:
      ConfigError: naming the sidecar, what it reports and the fix.
    """
    if not c.generator.sidecar_urls or not c.generator.colocate_with_trainer:
        return
    want = float(c.generator.gpu_memory_utilization)
    for url, h in health.items():
        mem = h.get("gpu_memory") or {}
        got = mem.get("vllm_gpu_memory_utilization", mem.get("xla_mem_fraction"))
        if got is None or abs(float(got) - want) > 1e-9:
            raise ConfigError("generator.gpu_memory_utilization", f"the sidecar {url} claims {got} of each GPU, "
                              f"the config {want}", f"start it with JAXRL_GPU_MEMORY_UTILIZATION={want:g} "
                              "(launch/vllm_sidecar.sh; XLA_PYTHON_CLIENT_MEM_FRACTION for a JAX sidecar) or set "
                              "the key to what it uses")


def plan_line(c, estimate_bytes: int, device_memory_gib: float) -> str:
    """`jaxrl.plan`'s line: the trainer's share of a device next to the compiled estimate."""
    share = float(c.trainer.gpu_memory_fraction)
    pool = share * device_memory_gib
    est = estimate_bytes / 2**30
    verdict = "fits" if est <= pool else f"does NOT fit: raise trainer.gpu_memory_fraction to >= " \
                                         f"{est / device_memory_gib:.2f} or shrink the step"
    return (f"  trainer share: trainer.gpu_memory_fraction {share:.2f} x {device_memory_gib:g} GiB = {pool:.1f} GiB "
            f"per device for an estimate of {est:.2f} GiB: {verdict}")
