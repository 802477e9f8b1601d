"""Test-wide setup: 8 fake CPU devices (must happen before jax is imported) and float32 matmuls."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# One persistent XLA compilation cache for the whole session, this process and every subprocess it
# starts (the trainer, sidecar and launch tests run `python -m jaxrl.main` many times on the same
# shapes): a program compiled once is loaded from disk afterwards. JAX keys each entry by the
# program, the backend and the compile options, so a hit is the same executable.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxrl-test-xla-cache-")
    atexit.register(shutil.rmtree, _cache, True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
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
