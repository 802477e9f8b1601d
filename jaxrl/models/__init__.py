"""jaxrl.models: Qwen3 in flax.nnx (``qwen3``: the model and its training forward, re-exporting
``qwen3_config``, ``qwen3_core``, ``logprob_head``, ``qwen3_kv_cache`` and the rollout engine's
``qwen3_engine``) and HF checkpoint I/O (``hf_io``, re-exporting ``qwen3_config`` and the prompt
format of ``chat_template``).

Importing this package does not import JAX (the vLLM worker uses ``hf_io`` without JAX);
import the submodules explicitly: ``from jaxrl.models import qwen3, hf_io``.
"""
