"""The scales of a recipe (`configs/rloo.py:qwen3_8b`): the size-dependent keys `apply_scale` sets."""
from __future__ import annotations

import ml_collections

from jaxrl.errors import ConfigError


SCALES = ("", "cpu", "qwen3_8b")


def apply_scale(c: ml_collections.ConfigDict, scale: str) -> ml_collections.ConfigDict:
    """Sets the size-dependent keys of a recipe for a named scale.

    "" / "cpu": the embedded default policy on the built-in arithmetic task; finishes on a
    2-core CPU. The tiny policy needs a larger learning rate than the 8B recipe's 8e-6 to move
    within a few dozen steps, so this scale raises it (the algorithm is otherwise unchanged).
    "qwen3_8b": the cluster recipe: a Qwen3-8B HF checkpoint (model.path required), bf16
    compute, full remat, cuDNN attention, FSDP over 8 devices per replica, vLLM sidecars, and
    the seed runs' terminal-agent settings: `data.dataset_path` takes a Harbor task set (task
    directory, folder, DCAgent .parquet) as well as a prompt file; the Terminus prompt, agent
    900 s, verifier 120 s, the verifier sanity gate, the seed run's sampling (temperature 1.2 /
    top-p 0.95 / top-k 20), a 32k-token context (32,000 input tokens) and 4,096 tokens per turn.
    The engine's logprobs are "raw" (temperature 1, full vocabulary: vLLM's default raw_logprobs,
    which the seed runs trained with), the trainer's at temperature 1.2; rl_config.json says so
    (`_derived.logprobs`). The error policy is the seed runs' (`harbor.error_policy`). Thinking
    is on, and message renderings keep the `<think>` block of past turns
    (`generator.chat_template=keep_thinking`), as in the seed runs.

    Raises:
      ConfigError: for an unknown scale name.
    """
    scale = scale or "cpu"
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r} in the config string (RECIPE.py:SCALE); the scales are "
                          f"{', '.join(s for s in SCALES if s)} (cpu is the default: no :SCALE). "
                          "Fix: e.g. --config=configs/rloo.py or --config=configs/rloo.py:qwen3_8b")
    c.scale = scale
    if scale == "cpu":
        c.trainer.optimizer.lr = 1e-4 if c.trainer.optimizer.lr == 8e-6 else c.trainer.optimizer.lr
        return c
    # qwen3_8b
    c.model.path = ""  # must be given on the command line
    c.model.preset = "8B"
    c.model.compute_dtype = "bfloat16"
    c.model.remat = "full"
    c.model.attention_impl = "cudnn"
    c.model.logprobs_chunk_size = 2048
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 8, 1
    c.data.task = "dataset"
    c.data.max_prompt_length = 4096
    c.generator.backend = "vllm"
    c.generator.gpu_memory_utilization = 0.85  # split layout: vLLM on its own nodes (docs/cluster.md "GPU memory")
    c.trainer.gpu_memory_fraction = 0.9  # split layout: the trainer alone on its GPUs
    c.generator.max_turns = 1000  # Terminus has no turn limit: the agent budget and the context end episodes
    c.generator.sampling_params.max_generate_length = 4096
    c.generator.max_input_tokens = 32000
    sp = c.generator.sampling_params
    sp.temperature, sp.top_p, sp.top_k = 1.2, 0.95, 20  # 56GPU_qwen3_8b.yaml (later seed runs: 0.7)
    c.trainer.algorithm.temperature = 1.2  # pi_theta / pi_old at the sampling temperature (SkyRL's default)
    # The seed runs' vLLM returned its default raw_logprobs (temperature 1, before top-p/top-k) as mu;
    # "sampled" (the truncated distribution at T 1.2) is the consistent alternative (docs/recipes.md).
    c.generator.logprobs_mode = "raw"
    # The seed runs think (chat_template_kwargs enable_thinking: true) and their vLLM renders every
    # past assistant turn with its <think> block (qwen3_thinking_acc.jinja2): jaxrl/envs/chat.py.
    c.generator.enable_thinking = True
    c.generator.chat_template = "keep_thinking"
    c.data.verify_tasks = True
    c.harbor.prompt_style = "terminus-2"
    # the seed runs' error policy (56GPU_qwen3_8b.yaml terminal_bench.harbor, Harbor's exception names)
    ep = c.harbor.error_policy
    ep.mask = ("DaytonaError", "EnvironmentStartTimeoutError", "NetworkError", "ConnectionError",
               "RewardFileNotFoundError", "RewardFileEmptyError", "AgentEnvironmentTimeoutError",
               "ContextLengthExceededError")
    ep.passthrough = ("AgentTimeoutError",)
    ep.zero = ()
    ep.default = "zero"
    ep.no_retry = ("VerifierTimeoutError", "VerifierRuntimeError", "RewardFileNotFoundError", "RewardFileEmptyError",
                   "VerifierOutputParseError")
    ep.max_retries, ep.min_wait_sec, ep.max_wait_sec, ep.wait_multiplier = 3, 60.0, 600.0, 2.0
    c.harbor.agent_timeout_sec = 900.0
    c.harbor.verifier_timeout_sec = 120.0
    c.trainer.algorithm.max_seq_len = 32768
    c.trainer.num_steps = 200
    c.trainer.train_batch_size = 64
    c.trainer.mini_batch_size = 64
    c.trainer.micro_batch_size = 8  # one 32k-token sequence per device on 8 trainer GPUs (2 GH200 nodes)
    c.trainer.eval_interval = 10
    c.trainer.ckpt_interval = 5
    c.trainer.seq_len_buckets = (4096, 8192, 16384, 32768)
    c.trainer.save_on_new_best = False
    return c
