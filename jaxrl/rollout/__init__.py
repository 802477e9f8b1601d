"""jaxrl.rollout: generation backends behind one client (DESIGN.md §6).

Modules (import them explicitly; this package imports nothing heavy, so the vLLM worker process
can use `weight_sync` and `vllm_worker` without JAX):
  types        SamplingParams, Completion, Generator protocol
  sampler      JAX KV-cache engine (`Sampler`, `sampler_from_hf`)
  sidecar      HTTP server around an engine, `SidecarProcess`, `SidecarClient`
  weight_sync  publish / load policy versions as Orbax checkpoints; tensorstore reader
  vllm_worker  vLLM worker extension loading published versions (`OrbaxWeightLoader`)
"""
