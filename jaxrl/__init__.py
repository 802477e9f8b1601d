"""jaxrl: RL post-training of Qwen3 policies in JAX (architecture: docs/ in the repository)."""

from jaxrl import noise as _noise

_noise.install()  # before any module imports transformers (its import-time "PyTorch was not found")

__version__ = "0.1.0"
