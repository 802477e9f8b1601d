"""jaxrl: RL post-training of Qwen3 policies in JAX (see DESIGN.md in the project docs)."""

__version__ = "0.1.0"
