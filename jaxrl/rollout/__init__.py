"""jaxrl.rollout: generation backends behind one client (docs/sidecar.md).

Modules (import them explicitly; this package imports nothing heavy, so the vLLM worker and the
vLLM front can run without JAX):
  types          SamplingParams, Completion, EngineRequest, the Generator and Engine protocols
  sampler        JAX KV-cache engine (`Sampler`, `sampler_from_hf`)
  wire           the sidecar's HTTP wire format (requests, responses, limits), used by both ends
  logprob_modes  which logprob definition an engine returns ("full" / "sampled"; vLLM's modes)
  server         the sidecar's FastAPI app, the JAX engine backend and its batch scheduler
  vllm_backend   the sidecar backend proxying to a loopback vLLM server (weight loads, checks)
  sidecar        the sidecar's command line: ``python -m jaxrl.rollout.sidecar``
  process        `SidecarProcess`: a JAX sidecar as a child process of the trainer
  client         `SidecarClient` (the trainer's side), `SidecarError` and its kinds
  weight_sync    publish / load policy versions as Orbax checkpoints; tensorstore reader
  vllm_worker    vLLM worker extension loading published versions (`OrbaxWeightLoader`)
"""
