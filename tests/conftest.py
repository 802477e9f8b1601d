"""Test-wide setup: 8 fake CPU devices (must happen before jax is imported) and float32 matmuls."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    """The embedded default policy's tokenizer (Qwen3 special tokens and chat template)."""
    from jaxrl.envs import DEFAULT_POLICY_DIR, load_tokenizer

    return load_tokenizer(DEFAULT_POLICY_DIR)


@pytest.fixture(scope="module")
def chat(tok):
    """A non-thinking ChatTemplate over `tok`."""
    from jaxrl.envs import ChatTemplate

    return ChatTemplate(tok, enable_thinking=False)
