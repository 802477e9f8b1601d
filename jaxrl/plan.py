"""Ahead-of-time plan of a recipe's train step: compile it for the config's mesh on fake CPU
devices, without allocating weights, and print per-device memory and compile time.

  python -m jaxrl.plan --config=configs/rloo.py:qwen3_8b --num_devices=16 --seq_len=4096
  python -m jaxrl.plan --config=configs/rloo.py:qwen3_8b --num_devices=8 --config.mesh.fsdp=4

The compiled program is the real one (`jaxrl.train.step.train_step`: forward, chunked
logprobs, the policy loss, micro-batch accumulation, AdamW update with donated params and
optimizer state) over one mini-batch of `mini_batch_size * n_samples_per_prompt` sequences.
Figures come from XLA's `memory_analysis()` of the CPU compilation: they are an estimate for
GPU that errs high (the CPU pipeline all-reduces gradients in f32 instead of reduce-scattering,
widens bf16 buffers to f32 where it lacks bf16 kernels — e.g. an f32 copy of the saved layer
inputs — and compiles the blocked XLA attention, whose memory is linear in T like cuDNN's).
With `trainer.optimizer.offload` the state kept in pinned host memory is reported separately and
left out of the per-device total (the CPU analysis counts it with the arguments).
"""
from __future__ import annotations

import math
import os
import sys
import time

from absl import flags
from ml_collections import config_flags

from jaxrl import cli

# The command's flags are registered by its entry point only (define_flags), so that several
# jaxrl commands (main, plan, evaluate, chat) can be imported into one process without absl's
# DuplicateFlagError on their shared names (--config, --model).
_CONFIG = None
_NUM_DEVICES = None
_SEQ_LEN = None
_ATTENTION = None
_DEVICE_MEMORY = None


def define_flags() -> None:
    """Registers this command's absl flags (called once, by `python -m` of this module)."""
    global _CONFIG, _NUM_DEVICES, _SEQ_LEN, _ATTENTION, _DEVICE_MEMORY
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file, e.g. configs/rloo.py:qwen3_8b.")
    _NUM_DEVICES = flags.DEFINE_integer("num_devices", 0, "Fake devices (0: the product of the config's mesh axes, "
                                        "or 8 when one axis is -1).")
    _SEQ_LEN = flags.DEFINE_integer("seq_len", 0, "Padded sequence length (0: the largest seq_len_bucket that "
                                    "max_seq_len / generator limits need).")
    _ATTENTION = flags.DEFINE_string("attention", "xla", "Attention implementation to compile on CPU (cuDNN is GPU-only; "
                                     "the default blocked kernel's memory is linear in T, as cuDNN's).")
    _DEVICE_MEMORY = flags.DEFINE_float("device_memory_gib", 140.0, "Memory of one GPU in GiB (nvidia-smi's total / "
                                       "1024), for the trainer's share trainer.gpu_memory_fraction: about 140 on an H200, "
                                       "79.6 on an H100 80GB.")


def _gib(x: int) -> str:
    return f"{x / 2**30:.2f} GiB"


def plan(c, num_devices: int, seq_len: int, attention: str = "xla") -> dict:
    """Compiles the train step for `c` on `num_devices` (already-created) devices; returns the figures.

    Raises:
      ConfigError: invalid config; parallel.ShardingError: a mesh that does not divide the model.
    """
    import jax
    import jax.numpy as jnp

    from jaxrl import config as config_lib
    from jaxrl import parallel
    from jaxrl.envs import DEFAULT_POLICY_DIR
    from jaxrl.models import qwen3
    from jaxrl.rl import reductions
    from jaxrl.train import step as step_lib

    config_lib.validate(c, num_devices=num_devices, check_inputs=False)
    runtime = dict(dtype=c.model.compute_dtype, remat=c.model.remat, attention=attention)
    if c.model.path:
        model_cfg = qwen3.Qwen3Config.from_pretrained(c.model.path, **runtime)
    elif c.model.preset:
        model_cfg = qwen3.Qwen3Config.preset(c.model.preset, **runtime)
    else:
        model_cfg = qwen3.Qwen3Config.from_pretrained(DEFAULT_POLICY_DIR, **runtime)

    mesh = parallel.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, devices=jax.devices()[:num_devices])
    abstract = qwen3.abstract_params(model_cfg)
    psh = parallel.param_shardings(qwen3.param_logical_axes(model_cfg), mesh, shapes=abstract)
    from jaxrl.config import loss_config

    a = c.trainer.algorithm
    loss_cfg = loss_config(c)
    rows = c.trainer.mini_batch_size * c.generator.n_samples_per_prompt
    offload = c.trainer.optimizer.offload
    step_cfg = step_lib.StepConfig(loss=loss_cfg, temperature=a.temperature,
                                   num_micro_batches=rows // c.trainer.micro_batch_size,
                                   chunk_size=c.model.logprobs_chunk_size,
                                   save_probs=c.model.logprobs_save_probs, offload=offload)
    tx, sched = step_lib.make_optimizer(c.trainer.optimizer.lr, 1000, max_grad_norm=c.trainer.optimizer.max_grad_norm)
    abs_opt = jax.eval_shape(tx.init, abstract)
    moments_host, master_host = step_lib.offloaded(offload)
    osh = parallel.opt_state_shardings(abs_opt, abstract, psh, mesh, "pinned_host" if moments_host else None)
    psh = parallel.with_memory_kind(psh, "pinned_host" if master_host else None)
    with_sh = lambda tree, sh: jax.tree.map(lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), tree, sh)
    row_sh = parallel.batch_sharding(mesh, 1)
    tok_sh = parallel.batch_sharding(mesh, 2)
    T = seq_len
    i32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=tok_sh)
    f32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=tok_sh)
    batch = dict(tokens=i32((rows, T)), positions=i32((rows, T)), segment_ids=i32((rows, T)),
                 loss_mask=i32((rows, T - 1)), advantages=f32((rows, T - 1)), old_logprobs=f32((rows, T - 1)),
                 rollout_logprobs=f32((rows, T - 1)),
                 is_truncated=jax.ShapeDtypeStruct((rows,), jnp.bool_, sharding=row_sh))
    if config_lib.needs_reference(c):  # what the trainer's mini-batches carry (a KL loss or KL in reward)
        batch["ref_logprobs"] = f32((rows, T - 1))
    weights = reductions.LossWeights(policy=f32((rows, T - 1)), token=f32((rows, T - 1)),
                                     sequence_token=f32((rows, T - 1)),
                                     sequence=jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=row_sh),
                                     selected=f32((rows, T - 1))
                                     if loss_cfg.policy_loss_type in reductions.COVARIANCE_LOSSES else None)
    fn = jax.jit(lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=model_cfg, step_cfg=step_cfg, tx=tx,
                                                        schedule=sched),
                 out_shardings=(psh, osh, None), donate_argnums=(0, 1))
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = fn.lower(with_sh(abstract, psh), with_sh(abs_opt, osh), batch, weights)
        compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    n_params = sum(int(jnp.prod(jnp.array(x.shape))) for x in jax.tree.leaves(abstract))

    def shard_bytes(tree, shardings):
        return sum(math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize
                   for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))

    # Donated state in pinned host memory (trainer.optimizer.offload): XLA's CPU analysis counts
    # it with the arguments (aliased to the outputs); on a GPU it is not in device memory.
    host = (shard_bytes(abs_opt, osh) if moments_host else 0) + (shard_bytes(abstract, psh) if master_host else 0)
    out = dict(mesh=dict(mesh.shape), params=n_params, rows=rows, seq_len=T, offload=offload,
               micro_batches=step_cfg.num_micro_batches, compile_s=compile_s,
               argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
               alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
               host_bytes=int(host))
    out["total_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
                          - out["host_bytes"])
    return out


def main(argv):
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    c = _CONFIG.value
    if c is None:
        cli.usage_error("--config is required, e.g. --config=configs/rloo.py:qwen3_8b")
    try:
        axes = [int(c.mesh.data), int(c.mesh.fsdp), int(c.mesh.tensor)]
    except OSError as e:  # ml_collections defers a missing/broken recipe file to the first access
        cli.recipe_load_error(e)
    n = _NUM_DEVICES.value or (8 if -1 in axes else axes[0] * axes[1] * axes[2])
    if "jax" in sys.modules:
        raise RuntimeError("jaxrl.plan must set the fake device count before jax is imported")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    seq_len = _SEQ_LEN.value
    if not seq_len:
        from jaxrl.train.trainer import bucket_length

        g = c.generator
        need = int(c.trainer.algorithm.max_seq_len) or (c.data.max_prompt_length + g.max_turns *
                                                         g.sampling_params.max_generate_length)
        seq_len = bucket_length(need, c.trainer.seq_len_buckets)
    from jaxrl.config import ConfigError
    from jaxrl.parallel import ShardingError

    try:
        r = plan(c, n, seq_len, _ATTENTION.value)
    except (ConfigError, ShardingError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    m = r["mesh"]
    print(f"jaxrl plan: {c.name} ({c.scale}), {r['params'] / 1e9:.3f} B params, mesh data={m['data']} x "
          f"fsdp={m['fsdp']} x tensor={m['tensor']} ({n} devices)")
    print(f"  mini-batch: {r['rows']} sequences x {r['seq_len']} tokens in {r['micro_batches']} micro-batches")
    host = r["host_bytes"]
    print(f"  per device: arguments {_gib(r['argument_bytes'] - host)}, outputs {_gib(r['output_bytes'] - host)} "
          f"(aliased {_gib(r['alias_bytes'] - host)}), temporaries {_gib(r['temp_bytes'])}, "
          f"total {_gib(r['total_bytes'])}")
    if r["offload"] != "none":
        print(f"  pinned host memory per device (trainer.optimizer.offload={r['offload']}): {_gib(host)}")
    print(f"  compile time: {r['compile_s']:.1f} s")
    from jaxrl import gpu_memory

    print(gpu_memory.plan_line(c, r["total_bytes"], _DEVICE_MEMORY.value))


if __name__ == "__main__":
    define_flags()
    cli.run(main, __doc__)
