"""jaxrl.models: Qwen3 in flax.nnx (``qwen3``) and HF checkpoint I/O (``hf_io``).

Importing this package does not import JAX (the vLLM worker uses ``hf_io`` without JAX);
import the submodules explicitly: ``from jaxrl.models import qwen3, hf_io``.
"""
