"""The rollout sidecar's command line: ``python -m jaxrl.rollout.sidecar``.

A sidecar is an HTTP server (server.py) speaking the token-in/token-out completions protocol
(wire.py) in front of one generation engine:

* ``--backend jax`` (default): the built-in JAX engine in this process, from ``--checkpoint``::

    python -m jaxrl.rollout.sidecar --checkpoint DIR --port N --sync-dir DIR --token-file F

* ``--backend vllm``: the jaxrl front of a vLLM server that listens on loopback only (started by
  launch/vllm_sidecar.sh). The front is the only thing on the cluster address: it checks the
  token, proxies completions, and performs weight loads itself (pause, load through the jaxrl
  worker extension, per-worker version check, cache reset, resume); nothing else of vLLM's API is
  reachable through it::

    python -m jaxrl.rollout.sidecar --backend vllm --upstream http://127.0.0.1:8001 \\
        --vllm-logprobs-mode processed_logprobs --host 0.0.0.0 --port 8000 --sync-dir DIR --token-file F

The trainer talks to either with `jaxrl.rollout.client.SidecarClient`, and starts JAX sidecars as
child processes with `jaxrl.rollout.process.SidecarProcess`.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
from typing import Any, Callable, NoReturn, Optional, Sequence

from jaxrl.errors import ArgumentParser
from jaxrl.rollout import wire

log = logging.getLogger("jaxrl.sidecar")


def _import_factory(spec: str):
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--engine: expected 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), name)


DEFAULT_ENGINE = "jaxrl.rollout.sampler:engine_from_args"


def _number(kind: type, lo: float, hi: float = math.inf, lo_open: bool = False) -> Callable[[str], Any]:
    """An argparse `type=` that parses `kind` and refuses a value outside [lo, hi] ((lo, hi] with `lo_open`) or
    not finite, as argparse's own one-line error ("argument --port: 99999: must be in [0, 65535]")."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if not math.isfinite(value) or (value <= lo if lo_open else value < lo) or value > hi:
            if hi == math.inf:
                what = f"> {lo:g}" if lo_open else f">= {lo:g}"
            else:
                what = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise argparse.ArgumentTypeError(f"{text}: must be {what}")
        return value
    return parse


def build_arg_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m jaxrl.rollout.sidecar", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="jax", choices=["jax", "vllm"],
                   help="jax: the built-in engine in this process; vllm: front of a loopback vLLM server")
    p.add_argument("--checkpoint", default=None, help="jax: HF checkpoint directory of the initial policy (version 0)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=_number(int, 0, 65535), required=True,
                   help="TCP port (0: any free one)")
    p.add_argument("--sync-dir", default=None, help="directory that weight loads must come from")
    p.add_argument("--token-file", default=None,
                   help="file holding the shared bearer token; required by every route but /health, and by loads")
    p.add_argument("--resume-latest", action="store_true",
                   help="at start-up, load the newest committed version in --sync-dir")
    p.add_argument("--model-name", default="policy")
    p.add_argument("--log-level", default="info")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="exit when the process that started this one dies (trainer-owned sidecars)")
    g = p.add_argument_group("jax backend")
    g.add_argument("--max-batch-rows", type=_number(int, 1), default=64, help="rows (prompts x n) per engine call")
    g.add_argument("--batch-wait-ms", type=_number(float, 0), default=5.0,
                   help="how long to collect requests into a batch")
    g.add_argument("--max-seq-len", type=_number(int, 2), default=4096, help="prompt + generated tokens per row")
    g.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="engine compute dtype")
    g.add_argument("--engine", default=DEFAULT_ENGINE,
                   help="'module:function' building the engine from these parsed arguments")
    v = p.add_argument_group("vllm backend")
    v.add_argument("--upstream", default=None,
                   help="vLLM server base URL on this host (http://127.0.0.1:PORT) or unix:/path/to/socket")
    v.add_argument("--upstream-model", default=None, help="vLLM's --served-model-name (default: --model-name)")
    v.add_argument("--vllm-logprobs-mode", default=None, choices=["processed_logprobs", "raw_logprobs"],
                   help="the --logprobs-mode vLLM was started with (reported by /health, checked per request)")
    v.add_argument("--gpu-memory-utilization", type=_number(float, 0, 1, lo_open=True), default=None,
                   help="the --gpu-memory-utilization vLLM was started with (reported by /health)")
    v.add_argument("--model-dir", default=None,
                   help="the HF checkpoint vLLM serves: its config.json gives the load probe the architecture")
    v.add_argument("--served-dtype", default=None, choices=["float32", "bfloat16"],
                   help="vLLM's --dtype: versions published in another dtype are refused; sets the probe tolerance")
    v.add_argument("--upstream-start-timeout", type=_number(float, 0, lo_open=True), default=1800.0,
                   help="seconds to wait for vLLM to come up before giving up")
    lim = p.add_argument_group("request limits (a request over a limit gets a 4xx naming it)")
    d = wire.RequestLimits()
    lim.add_argument("--max-n", type=int, default=d.max_n, help="samples per prompt")
    lim.add_argument("--max-prompts", type=int, default=d.max_prompts, help="prompts per request")
    lim.add_argument("--max-rows", type=int, default=d.max_rows, help="prompts x n per request")
    lim.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens, help="tokens of one prompt")
    lim.add_argument("--max-total-tokens", type=int, default=d.max_total_tokens,
                     help="n x (prompt tokens + max_tokens) summed over a request's prompts")
    lim.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="size of a request body")
    return p


def _usage_error(message: str) -> NoReturn:
    """Exits 2 with `error: python -m jaxrl.rollout.sidecar: MESSAGE (see ... --help)`, as argparse's own errors."""
    build_arg_parser().error(message)


def _read_token(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        _usage_error(f"--token-file {path}: cannot read it ({e.strerror}). Fix: pass the file holding the "
                     "shared token (the trainer writes WORKDIR/.sidecar_token)")
    if not token:
        _usage_error(f"--token-file {path} is empty")
    return token


def build_backend(args):
    """The backend the parsed arguments ask for (the JAX engine is built here, in this process)."""
    if args.backend == "vllm":
        if not args.upstream:
            _usage_error("--backend vllm needs --upstream (the loopback URL or unix socket of vLLM)")
        if args.vllm_logprobs_mode is None:
            _usage_error("--backend vllm needs --vllm-logprobs-mode (the --logprobs-mode vLLM was started with)")
        if not args.model_dir or not args.served_dtype:
            _usage_error("--backend vllm needs --model-dir and --served-dtype (every weight load is verified by a "
                         "probe computed from them); launch/vllm_sidecar.sh passes both")
        from jaxrl.rollout.vllm_backend import VllmBackend

        try:
            return VllmBackend(args.upstream, api_key=_read_token(args.token_file),
                               vllm_logprobs_mode=args.vllm_logprobs_mode,
                               gpu_memory_utilization=args.gpu_memory_utilization,
                               model=args.upstream_model or args.model_name, start_timeout_s=args.upstream_start_timeout,
                               model_dir=args.model_dir, dtype=args.served_dtype)
        except ValueError as e:
            _usage_error(str(e))
    if not args.checkpoint:
        _usage_error("--backend jax needs --checkpoint (an HF checkpoint directory)")
    from jaxrl.fileio import HF_CHECKPOINT_HINT, hf_checkpoint_problem

    problem = hf_checkpoint_problem(args.checkpoint) if args.engine == DEFAULT_ENGINE else None
    if problem:  # (another --engine factory reads --checkpoint its own way)
        _usage_error(f"--checkpoint: {problem}. Fix: pass {HF_CHECKPOINT_HINT}")
    from jaxrl.rollout.server import JaxBackend

    engine = _import_factory(args.engine)(args)
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    return JaxBackend(engine, max_batch_rows=args.max_batch_rows, batch_wait_ms=args.batch_wait_ms,
                      gpu_memory_fraction=float(fraction) if fraction else None)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_arg_parser().parse_args(argv)
    if args.exit_with_parent:
        from jaxrl.rollout.process import exit_with_parent

        exit_with_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    token = _read_token(args.token_file)
    try:
        limits = wire.RequestLimits(max_n=args.max_n, max_prompts=args.max_prompts, max_rows=args.max_rows,
                                    max_prompt_tokens=args.max_prompt_tokens, max_total_tokens=args.max_total_tokens,
                                    max_body_bytes=args.max_body_bytes)
    except ValueError as e:
        _usage_error(f"request limits: {e}")
    backend = build_backend(args)
    import uvicorn

    from jaxrl.rollout.server import create_app

    app = create_app(backend, sync_dir=args.sync_dir, token=token, limits=limits, model_name=args.model_name,
                     resume_latest=args.resume_latest)
    log.info("%s sidecar on %s:%d", args.backend, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())


if __name__ == "__main__":
    main()
