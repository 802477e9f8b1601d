"""Run configuration: the recipe schema, its validation, and the `rl_config.json` dump.

A recipe (configs/*.py) returns an `ml_collections.ConfigDict` built from `base_config()`; keys
read like SkyRL's where the concept is the same (`trainer.algorithm.*`, `generator.*`), so a
recipe ports over by name. `validate(config)` runs before any work starts and raises
`ConfigError` naming the key and the fix.

Scales: the same recipe file takes a config string (`configs/rloo.py:qwen3_8b`); the default
(no string) is the CPU scale that trains the embedded default policy on the built-in task.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Optional

import ml_collections

from jaxrl.errors import ConfigError  # public here; defined below config, as jaxrl.gpu_memory raises it too
from jaxrl.fileio import HF_CHECKPOINT_HINT, atomic_write_json, hf_checkpoint_problem, tokenizer_problem


def base_config() -> ml_collections.ConfigDict:
    """The full schema with defaults for the CPU scale (embedded policy, arithmetic task)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.name = "rloo"
    c.scale = "cpu"  # set by apply_scale: cpu | qwen3_8b | ...

    # ---- policy model ---------------------------------------------------------------------
    c.model = ml_collections.ConfigDict()
    c.model.path = ""  # HF checkpoint directory; "" = the embedded default policy
    c.model.compute_dtype = "float32"  # "bfloat16" on accelerators; params are fp32 masters
    c.model.remat = "none"  # none | full | save_dots | save_attention | save_dots_attention
    c.model.attention_impl = "xla"  # xla (blocked flash, any backend) | cudnn (GPU) | splash (TPU)
    c.model.logprobs_chunk_size = 1024  # tokens per chunk of the chunked log-softmax
    c.model.logprobs_save_probs = False  # keep exp(logits - max) for the backward pass (no logits recompute)
    c.model.preset = ""  # Qwen3 preset (e.g. "8B") used by `jaxrl.plan` when model.path is empty

    # ---- device mesh ----------------------------------------------------------------------
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1  # -1 = all remaining devices
    c.mesh.tensor = 1

    # ---- tasks / data ---------------------------------------------------------------------
    c.data = ml_collections.ConfigDict()
    c.data.task = "arithmetic"  # a registered built-in task, "dataset" (see dataset_path) or "harbor"
    # task == "dataset": a JSONL / Parquet prompt file, or a Harbor task set (below); task == "harbor":
    # a Harbor task set: a task directory, a folder of tasks, a DCAgent .parquet (columns path,
    # task_binary) or `family:<name>:<first>-<last>` (a templated family, jaxrl/envs/harbor/families.py).
    # Only with task "dataset" / "harbor" (an error otherwise).
    c.data.dataset_path = ""
    # Harbor task sets: run the verifier sanity gate (oracle must score 1, an empty agent 0) before
    # training and leave out (and log) the tasks that fail it.
    c.data.verify_tasks = False
    c.data.eval_task = ""  # "" = the held-out split of `task`
    # Held-out prompts of a dataset run: a file of its own, or a share of the training file.
    # Harbor task sets: a held-out task set; "" = hold out num_eval_prompts tasks of dataset_path.
    c.data.eval_dataset_path = ""  # JSONL or Parquet, the row format of dataset_path (or a Harbor task set)
    c.data.eval_fraction = 0.05  # task=dataset without eval_dataset_path: share of the file's prompts held out
    c.data.eval_split_seed = 0  # seed of that split (not `seed`: runs with other seeds share the held-out set)
    c.data.num_eval_prompts = 200  # 0 = no held-out evaluation
    c.data.max_prompt_length = 128  # tokens; longer prompts are rejected at load

    # ---- rollout generation ---------------------------------------------------------------
    c.generator = ml_collections.ConfigDict()
    c.generator.backend = "jax"  # jax (built-in engine sidecar) | vllm (external sidecars)
    # Base URLs of running sidecars: required for backend=vllm; for backend=jax, external JAX
    # sidecars (e.g. started by launch/slurm_job.sh --engine=jax) instead of spawning num_sidecars.
    c.generator.sidecar_urls = ()
    c.generator.num_sidecars = 1  # for backend=jax without sidecar_urls: sidecar processes to spawn
    c.generator.token_file = ""  # shared sidecar token; "" = workdir/.sidecar_token (created)
    # Logprob definition of the rollout engines (rollout/logprob_modes.py), one per run: "full" =
    # log softmax(logits / T) over the whole vocabulary (docs/architecture.md §3, the trainer's definition);
    # "sampled" = under the distribution actually sampled (after top-k/top-p, renormalised).
    c.generator.logprobs_mode = "full"
    # GPU memory (jaxrl/gpu_memory.py): each sidecar engine's share of every GPU it shares with the
    # trainer (a JAX sidecar's XLA memory fraction; vLLM's --gpu-memory-utilization when
    # colocate_with_trainer puts vLLM on the trainer's GPUs).
    c.generator.gpu_memory_utilization = 0.3
    c.generator.colocate_with_trainer = False  # backend=vllm: the vLLM sidecars share the trainer's GPUs
    c.generator.n_samples_per_prompt = 8
    c.generator.max_turns = 1
    # Longest input (prompt + conversation so far) one turn may be sent with, i.e. the agent's
    # context (Terminus's max_input_tokens); reaching it ends the episode (`length`). 0 = only the
    # trajectory budget (trainer.algorithm.max_seq_len / rollout_max_seq_len) applies.
    c.generator.max_input_tokens = 0
    c.generator.enable_thinking = False
    # How conversations rendered from messages show past assistant turns (jaxrl/envs/chat.py, "Past
    # thinking"): "" = the checkpoint's template (Qwen3's drops the reasoning of turns before the last
    # user message); "keep_thinking" = every past turn keeps its <think> block, as rollouts
    # (token-in/token-out) and the seed runs' template show them; the export carries that template.
    c.generator.chat_template = ""
    # A turn cut by max_generate_length is never executed (its tool calls do not run); True runs it.
    c.generator.execute_truncated_turns = False
    c.generator.sampling_params = ml_collections.ConfigDict()
    c.generator.sampling_params.max_generate_length = 16  # new tokens per turn
    c.generator.sampling_params.temperature = 1.0
    c.generator.sampling_params.top_p = 1.0
    c.generator.sampling_params.top_k = -1
    c.generator.eval_sampling_params = ml_collections.ConfigDict()
    c.generator.eval_sampling_params.temperature = 1.0
    c.generator.eval_sampling_params.greedy = True
    c.generator.eval_sampling_params.episodes_per_prompt = 1  # episodes per held-out prompt when not greedy
    # Benchmark/test knob: every episode takes at least this long (s), as slow multi-turn episodes
    # do; a group's delay is episode_delay_s * (1 + jitter * (2u - 1)), u uniform from (seed, prompt).
    c.generator.episode_delay_s = 0.0
    c.generator.episode_delay_jitter = 0.0

    # ---- Harbor terminal tasks (the Terminus-style agent loop, jaxrl/envs/harbor/agent.py) ----
    c.harbor = ml_collections.ConfigDict()
    c.harbor.prompt_style = "terminus-2"  # terminus-2 (Harbor's own texts, the seed runs' agent) | compact (embedded policy)
    c.harbor.harbor_wheel = ""  # a harbor wheel to read terminus-2's texts from; "" = the installed harbor package
    c.harbor.strict_json_parser = False  # True: no auto-correction, a response with warnings runs nothing
    c.harbor.stop_agent_processes = False  # kill the agent's processes before the verifier (Harbor: they keep running)
    # What a failed trial counts for (jaxrl/train/error_policy.py): per error class (an outcome, or
    # Harbor's exception name) mask / passthrough / zero, retries. The :qwen3_8b scale sets the seed runs'.
    c.harbor.error_policy = ml_collections.ConfigDict()
    c.harbor.error_policy.mask = ()
    c.harbor.error_policy.passthrough = ("agent_timeout",)
    c.harbor.error_policy.zero = ()
    c.harbor.error_policy.default = "zero"
    c.harbor.error_policy.no_retry = ()
    c.harbor.error_policy.max_retries = 0
    c.harbor.error_policy.min_wait_sec = 1.0
    c.harbor.error_policy.max_wait_sec = 60.0
    c.harbor.error_policy.wait_multiplier = 1.0
    c.harbor.agent_timeout_sec = 0.0  # the agent's wall-clock budget per trial; 0 = each task's [agent] timeout_sec
    c.harbor.verifier_timeout_sec = 0.0  # 0 = each task's [verifier] timeout_sec
    c.harbor.command_timeout_sec = 60.0  # cap on one command's wait (Terminus: 60 s)
    c.harbor.max_output_bytes = 10000  # terminal output per observation, head and tail kept (Terminus: 10 kB)
    c.harbor.concurrency = 0  # threads driving the trials of a step; 0 = one per trial, up to max(16, 8 x cores)
    c.harbor.keep_trial_logs = False  # keep each trial's logs/ and result.json under workdir/trials/
    c.harbor.environment_backend = "profile"  # profile (read the Dockerfile on host profiles) | image (build it) | auto
    c.harbor.base_images = ()  # "FROM name=local image" entries for the image backend (nothing is pulled)
    c.harbor.image_cache_max_mb = 20480  # built task images kept; least recently used ones above it are removed
    c.harbor.build_concurrency = 1  # image builds at once (1 fits 2 cores)
    c.harbor.image_builder = "buildah"  # the image backend's builder: "buildah" or "podman"
    c.harbor.image_cache_dir = ""  # index, build locks and logs of the image cache; "" = ~/.cache/jaxrl/images
    c.harbor.pip_mirror = ""  # a folder of wheels pip/uv in trials install from alone (no network needed); "" = none
    c.harbor.tool_mirror = ""  # a folder whose bin/ holds verifier tools (launch/make_tool_mirror.sh); "" = none

    # ---- trainer --------------------------------------------------------------------------
    c.trainer = ml_collections.ConfigDict()
    c.trainer.num_steps = 60  # RL steps (one rollout batch each)
    c.trainer.train_batch_size = 64  # prompts per RL step
    c.trainer.mini_batch_size = 64  # prompts per optimizer step
    c.trainer.micro_batch_size = 128  # sequences per micro-batch (gradient accumulation)
    c.trainer.update_epochs_per_batch = 1
    c.trainer.eval_interval = 10  # RL steps; 0 = only before training and at the end
    c.trainer.eval_before_train = True
    c.trainer.ckpt_interval = 5  # RL steps between Orbax checkpoints
    c.trainer.max_ckpts_to_keep = 2  # the best-EMA checkpoint is kept in addition
    c.trainer.weight_sync_keep = 2  # published policy versions kept in sync_dir
    c.trainer.seq_len_buckets = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    c.trainer.ema_span = 5  # trailing EMA of the mean reward: alpha = 2 / (span + 1)
    # Also checkpoint every step whose EMA is a new best, so the best checkpoint is the true best
    # step (cheap for small models). False: the best is the best-EMA step among the interval
    # checkpoints (what large models use: a checkpoint per step would dominate the run time).
    c.trainer.save_on_new_best = True
    c.trainer.export_best = True  # HF export of the best-EMA checkpoint to workdir/best/
    # A trajectory is a success when its reward >= this: reward/success_rate,
    # reward/avg_pass_at_<n> and eval/success_rate all use it (partial-credit rewards below it
    # count as failures everywhere).
    c.trainer.success_threshold = 1.0
    # Warn (one stderr line per step) when max |trainer logprob - engine logprob| over the loss
    # tokens (the metric rollout/logprob_diff_max) exceeds this; 0 = never warn; -1 = by
    # model.compute_dtype: 1e-3 for float32 (engines holding the trainer's float32 weights stay
    # below 1e-4), 1.0 for bfloat16 (see docs/numerics.md for the measured gaps).
    c.trainer.logprob_diff_warn_threshold = -1.0
    c.trainer.gpu_memory_fraction = 0.6  # share of each GPU the trainer's JAX claims (XLA memory fraction)

    c.trainer.optimizer = ml_collections.ConfigDict()
    c.trainer.optimizer.lr = 8e-6
    c.trainer.optimizer.weight_decay = 0.0
    c.trainer.optimizer.adam_betas = (0.9, 0.999)
    c.trainer.optimizer.adam_eps = 1e-8
    c.trainer.optimizer.max_grad_norm = 0.9
    c.trainer.optimizer.scheduler = "constant"  # constant | cosine (both after linear warm-up)
    c.trainer.optimizer.num_warmup_steps = 0  # optimizer steps
    # Where the optimizer state lives between steps: none (device) | moments (Adam mu/nu in pinned
    # host memory, e.g. a GH200's Grace memory) | moments_and_master (also the fp32 master params).
    c.trainer.optimizer.offload = "none"

    c.trainer.algorithm = ml_collections.ConfigDict()
    c.trainer.algorithm.advantage_estimator = "rloo_n"
    c.trainer.algorithm.group_advantage_min_size = 2
    c.trainer.algorithm.grpo_norm_by_std = True
    c.trainer.algorithm.policy_loss_type = "regular"
    c.trainer.algorithm.loss_reduction = "token_mean"
    c.trainer.algorithm.eps_clip_low = 0.2
    c.trainer.algorithm.eps_clip_high = 0.05
    c.trainer.algorithm.clip_ratio_c = 3.0
    c.trainer.algorithm.max_seq_len = 0  # required (> 0) for seq_mean_token_sum_norm
    c.trainer.algorithm.temperature = 1.0  # logits / temperature in the trainer's logprobs
    # The trainer's temperature must equal generator.sampling_params.temperature (otherwise
    # pi_old and the rollout policy mu are different distributions and every ratio is off);
    # True accepts a deliberate mismatch.
    c.trainer.algorithm.allow_temperature_mismatch = False
    c.trainer.algorithm.gamma = 1.0  # discount of the returns (reinforce_pp, gae)
    c.trainer.algorithm.lambd = 1.0  # GAE lambda
    c.trainer.algorithm.value_clip = 0.2  # critic loss clip; 0 = unclipped
    c.trainer.algorithm.use_kl_loss = True  # the KL term is on iff use_kl_loss and kl_loss_coef != 0
    c.trainer.algorithm.kl_loss_coef = 0.0  # 0 = no reference model is loaded
    c.trainer.algorithm.use_kl_in_reward = False  # KL in the token rewards instead (needs use_kl_loss=False)
    c.trainer.algorithm.kl_estimator_type = "k3"
    c.trainer.algorithm.kl_ctrl = ml_collections.ConfigDict()
    c.trainer.algorithm.kl_ctrl.type = "fixed"  # fixed | adaptive (use_kl_in_reward)
    c.trainer.algorithm.kl_ctrl.kl_target = 0.1
    c.trainer.algorithm.kl_ctrl.horizon = 10000
    c.trainer.algorithm.entropy_loss_coef = 0.0
    c.trainer.algorithm.cispo = ml_collections.ConfigDict()
    c.trainer.algorithm.cispo.cispo_eps_clip_low = 1.0
    c.trainer.algorithm.cispo.cispo_eps_clip_high = 4.0
    c.trainer.algorithm.cispo.cispo_anchor = "old"  # old | rollout
    c.trainer.algorithm.sapo = ml_collections.ConfigDict()
    c.trainer.algorithm.sapo.tau_pos = 1.0
    c.trainer.algorithm.sapo.tau_neg = 1.05
    c.trainer.algorithm.clip_cov = ml_collections.ConfigDict()
    c.trainer.algorithm.clip_cov.clip_ratio = 2e-4
    c.trainer.algorithm.clip_cov.clip_cov_lb = 1.0
    c.trainer.algorithm.clip_cov.clip_cov_ub = 5.0
    c.trainer.algorithm.kl_cov = ml_collections.ConfigDict()
    c.trainer.algorithm.kl_cov.kl_cov_frac = 0.2
    c.trainer.algorithm.kl_cov.ppo_kl_coef = 1.0
    c.trainer.algorithm.off_policy_correction = ml_collections.ConfigDict()
    c.trainer.algorithm.off_policy_correction.tis_ratio_type = ""  # "" | token | sequence
    c.trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high = 2.0
    c.trainer.algorithm.off_policy_correction.sequence_tis_ratio_clip_high = 5.0
    c.trainer.algorithm.off_policy_correction.only_untruncated = False
    # thresholds on rho = pi_old / mu; 0 = off
    c.trainer.algorithm.off_policy_correction.outlier_token_is_threshold_low = 0.0
    c.trainer.algorithm.off_policy_correction.outlier_token_is_threshold_high = 0.0
    c.trainer.algorithm.off_policy_correction.token_mask_is_threshold_low = 0.0
    c.trainer.algorithm.off_policy_correction.token_mask_is_threshold_high = 0.0
    c.trainer.algorithm.off_policy_correction.sequence_mask_metric = ""  # "" | geometric | product
    c.trainer.algorithm.off_policy_correction.geo_mask_low = 0.99
    c.trainer.algorithm.off_policy_correction.geo_mask_high = 1.01
    c.trainer.algorithm.off_policy_correction.product_mask_low = 0.5
    c.trainer.algorithm.off_policy_correction.product_mask_high = 2.0

    # The value model, created only when the advantage estimator needs one (gae).
    c.trainer.critic = ml_collections.ConfigDict()
    c.trainer.critic.model = ml_collections.ConfigDict()
    c.trainer.critic.model.path = ""  # HF Qwen3 checkpoint of the critic's trunk; "" = the policy's
    c.trainer.critic.optimizer = ml_collections.ConfigDict()
    c.trainer.critic.optimizer.lr = 5e-6
    c.trainer.critic.optimizer.weight_decay = 0.0
    c.trainer.critic.optimizer.max_grad_norm = 1.0

    # Asynchronous RL (docs/async.md). Named async_rl, not async: `async` is a Python keyword, and
    # ml_collections parses --config.a.b.c override paths as Python, so trainer.async.* could not be set.
    c.trainer.async_rl = ml_collections.ConfigDict()
    c.trainer.async_rl.mode = "sync"  # sync | one_step | fully_async
    c.trainer.async_rl.max_staleness_steps = 4  # fully_async: trained version - first-token version <= this
    c.trainer.async_rl.max_in_flight_trajectories = 0  # fully_async; 0 = (max_staleness_steps + 1) x B x n
    c.trainer.async_rl.stale_action = "drop"  # drop | regenerate: what becomes of a group older than the bound

    c.trainer.collapse = ml_collections.ConfigDict()
    c.trainer.collapse.enabled = True
    c.trainer.collapse.drop = 0.2  # EMA below best EMA by this much (absolute reward) ...
    c.trainer.collapse.patience = 3  # ... for this many consecutive steps = a collapse
    c.trainer.collapse.action = "stop"  # stop | rollback
    c.trainer.collapse.lr_factor = 0.5  # rollback: new lr = lr * lr_factor
    c.trainer.collapse.max_rollbacks = 2
    return c


# One line per key of `base_config()`: what it means, with units and allowed values. The single
# source of the meanings `python -m jaxrl.config show` prints; tests/test_config_cli.py fails for a
# key of base_config() without an entry here, so a new key must be described when it is added.
KEY_DOCS: dict[str, str] = {
    "seed": "seed of every random choice (prompt order, sampling); same seed + config = same metrics",
    "name": "run name: the default workdir is runs/<name>; the report's title",
    "scale": "size preset chosen by the config string (configs/x.py:qwen3_8b): cpu | qwen3_8b",
    # model
    "model.path": "HF checkpoint directory of the starting policy; '' = the embedded default policy",
    "model.compute_dtype": "dtype of the forward pass and of the published rollout weights: float32 | bfloat16",
    "model.remat": "activation recomputation per layer: none | full | save_dots | save_attention | "
                   "save_dots_attention",
    "model.attention_impl": "attention kernel: xla (blocked flash, any backend) | cudnn (NVIDIA GPU) | splash (TPU)",
    "model.logprobs_chunk_size": "tokens per chunk of the chunked log-softmax (never builds [N, T, vocab])",
    "model.logprobs_save_probs": "keep exp(logits - max), tokens x vocab in the compute dtype, for the backward "
                                 "pass (no logits recompute)",
    "model.preset": "Qwen3 size (e.g. '8B') that jaxrl.plan compiles when model.path is ''",
    # mesh
    "mesh.data": "devices on the data-parallel mesh axis; -1 = all remaining devices",
    "mesh.fsdp": "devices on the FSDP mesh axis (params and optimizer state sharded); -1 = all remaining",
    "mesh.tensor": "devices on the tensor-parallel mesh axis (heads and MLP split); -1 = all remaining",
    # data
    "data.task": "training prompts: arithmetic | arithmetic_partial | calculator | dataset | harbor (terminal tasks)",
    "data.dataset_path": "JSONL/Parquet prompt file (docs/usage.md) or a Harbor task set (docs/terminal_tasks.md)",
    "data.verify_tasks": "Harbor runs: verifier sanity gate first (oracle 1, empty agent 0); failing tasks left out",
    "data.eval_task": "built-in task whose held-out split is evaluated; '' = the held-out split of data.task",
    "data.eval_dataset_path": "JSONL or Parquet file of held-out prompts, or a held-out Harbor task set; '' = none",
    "data.eval_fraction": "data.task=dataset without eval_dataset_path: share of the file's distinct prompts "
                          "held out",
    "data.eval_split_seed": "seed of the eval_fraction split (not `seed`: runs with other seeds share it)",
    "data.num_eval_prompts": "held-out prompts evaluated before, during and after training; 0 = no evaluation",
    "data.max_prompt_length": "longest rendered prompt in tokens; a longer dataset prompt stops the run at start",
    # generator
    "generator.backend": "rollout engine: jax (built-in sidecar, CPU or GPU) | vllm (external vLLM sidecars)",
    "generator.sidecar_urls": "base URLs of running sidecars: required for vllm; for jax, used instead of spawning",
    "generator.num_sidecars": "JAX sidecar processes the trainer spawns (backend=jax without sidecar_urls)",
    "generator.token_file": "shared secret of the sidecars' weight-load endpoint; '' = workdir/.sidecar_token",
    "generator.logprobs_mode": "engine logprobs: full (log softmax(logits/T)) | sampled (after top-p/k) | raw "
                               "(at T 1, vLLM's default)",
    "generator.gpu_memory_utilization": "share (0-1) of each GPU a sidecar engine claims; no effect on CPU",
    "generator.colocate_with_trainer": "backend=vllm: the vLLM sidecars share the trainer's GPUs",
    "generator.n_samples_per_prompt": "samples per prompt: one group of n trajectories for the group advantages",
    "generator.max_turns": "assistant turns per trajectory (1 = single-turn; more for tools and multi-turn envs)",
    "generator.max_input_tokens": "longest input (tokens) of one turn, the agent's context; 0 = only max_seq_len",
    "generator.enable_thinking": "Qwen3 thinking mode of the chat template (False: empty <think></think> in "
                                 "the prompt)",
    "generator.chat_template": "past turns' thinking when messages are rendered: '' = the checkpoint's "
                               "template | keep_thinking",
    "generator.execute_truncated_turns": "run the tool calls of a turn cut by max_generate_length (False: never)",
    "generator.sampling_params.max_generate_length": "new tokens per assistant turn",
    "generator.sampling_params.temperature": "sampling temperature of training rollouts (= "
                                             "trainer.algorithm.temperature)",
    "generator.sampling_params.top_p": "nucleus mass of training rollouts, in (0, 1]; 1 = off",
    "generator.sampling_params.top_k": "top-k of training rollouts; -1 or 0 = off",
    "generator.eval_sampling_params.temperature": "temperature of held-out evaluation when greedy is False",
    "generator.eval_sampling_params.greedy": "held-out evaluation decodes greedily (argmax)",
    "generator.eval_sampling_params.episodes_per_prompt": "episodes per held-out prompt when not greedy",
    "generator.episode_delay_s": "benchmark/test knob: every episode takes at least this long (s); 0 = off",
    "generator.episode_delay_jitter": "spread of episode_delay_s per prompt, in [0, 1]: d x (1 + jitter x (2u - 1))",
    # Harbor terminal tasks
    "harbor.prompt_style": "agent prompt: terminus-2 (Harbor's own texts, read at run time) | compact (embedded policy)",
    "harbor.harbor_wheel": "path of a harbor wheel holding terminus-2's texts; '' = the installed harbor package",
    "harbor.strict_json_parser": "strict Terminus-2 parsing: no auto-correction, responses with warnings run nothing",
    "harbor.stop_agent_processes": "kill the agent's processes before the verifier runs (Harbor keeps them running)",
    "harbor.error_policy.mask": "error classes left out of the loss and the baselines (outcome or Harbor names)",
    "harbor.error_policy.passthrough": "error classes keeping the verifier's reward (e.g. agent_timeout)",
    "harbor.error_policy.zero": "error classes trained on with reward 0",
    "harbor.error_policy.default": "treatment of error classes in no list: mask | passthrough | zero",
    "harbor.error_policy.no_retry": "error classes never retried (Harbor's exclude_exceptions)",
    "harbor.error_policy.max_retries": "times a failed trial is played again (0 = never)",
    "harbor.error_policy.min_wait_sec": "shortest wait before a retry (s)",
    "harbor.error_policy.max_wait_sec": "longest wait before a retry (s)",
    "harbor.error_policy.wait_multiplier": "retry wait = clip(wait_multiplier * 2**attempt, min, max) seconds",
    "harbor.agent_timeout_sec": "agent's wall-clock budget per trial (s); 0 = the task's [agent] timeout_sec",
    "harbor.verifier_timeout_sec": "verifier's wall-clock limit per trial (s); 0 = the task's [verifier] timeout_sec",
    "harbor.command_timeout_sec": "cap in seconds on one command's wait (Terminus: 60)",
    "harbor.max_output_bytes": "terminal output bytes per observation, head and tail kept (Terminus: 10000)",
    "harbor.concurrency": "threads driving the trials of a step; 0 = one per trial, up to max(16, 8 x cores)",
    "harbor.keep_trial_logs": "keep each trial's logs/ and result.json under workdir/trials/",
    "harbor.environment_backend": "task environments: profile (Dockerfile read on host profiles) | image (built) | auto",
    "harbor.base_images": "image backend: 'FROM name=local image' entries mapping base images (nothing is pulled)",
    "harbor.image_cache_max_mb": "image backend: MB of built task images kept (least recently used removed above it)",
    "harbor.build_concurrency": "image backend: image builds at once",
    "harbor.image_builder": "image backend: the builder, 'buildah' or 'podman' (both run no container runtime)",
    "harbor.image_cache_dir": "image backend: index, locks and build logs; '' = ~/.cache/jaxrl/images",
    "harbor.pip_mirror": "a folder of wheels (pip download -d DIR ...) pip and uv in trials install from; '' = none",
    "harbor.tool_mirror": "a folder whose bin/ (launch/make_tool_mirror.sh DIR --uv VER) ends the verifier's PATH; "
                          "'' = none",
    # trainer
    "trainer.num_steps": "RL steps (one rollout batch each); raise it and rerun to continue a finished run",
    "trainer.train_batch_size": "prompts per RL step, each sampled n_samples_per_prompt times",
    "trainer.mini_batch_size": "prompts per optimizer step; divides train_batch_size",
    "trainer.micro_batch_size": "sequences per micro-batch (gradient accumulation); divides mini_batch_size x n",
    "trainer.update_epochs_per_batch": "passes over the step's mini-batches (PPO epochs)",
    "trainer.eval_interval": "RL steps between held-out evaluations; 0 = only before training and at the end",
    "trainer.eval_before_train": "evaluate the starting policy before step 1 (the report's 'start')",
    "trainer.ckpt_interval": "RL steps between Orbax checkpoints",
    "trainer.max_ckpts_to_keep": "latest checkpoints kept (the best-EMA checkpoint is kept in addition)",
    "trainer.weight_sync_keep": "published policy versions kept in workdir/sync",
    "trainer.seq_len_buckets": "padded sequence lengths (tokens) of the train step; one compile per bucket used",
    "trainer.ema_span": "span of the reward EMA that picks the best checkpoint: alpha = 2 / (span + 1)",
    "trainer.save_on_new_best": "also checkpoint every step whose reward EMA is a new best",
    "trainer.export_best": "export the best-EMA checkpoint in HF format to workdir/best/ at the end",
    "trainer.success_threshold": "a trajectory is a success when its reward >= this (success rates, pass@n, eval)",
    "trainer.logprob_diff_warn_threshold": "warn above this max |trainer - engine logprob|; 0 = never; -1 = by "
                                           "compute dtype",
    "trainer.gpu_memory_fraction": "share (0-1) of each GPU the trainer's JAX claims; no effect on CPU",
    "trainer.optimizer.lr": "AdamW peak learning rate",
    "trainer.optimizer.weight_decay": "AdamW decoupled weight decay",
    "trainer.optimizer.adam_betas": "AdamW (beta1, beta2)",
    "trainer.optimizer.adam_eps": "AdamW epsilon",
    "trainer.optimizer.max_grad_norm": "global gradient-norm clip",
    "trainer.optimizer.scheduler": "learning-rate schedule after the warm-up: constant | cosine",
    "trainer.optimizer.num_warmup_steps": "optimizer steps of linear learning-rate warm-up",
    "trainer.optimizer.offload": "optimizer state in pinned host memory: none | moments | moments_and_master",
    # trainer.algorithm: every key, its source and formula are in docs/recipes.md ("trainer.algorithm keys")
    "trainer.algorithm.advantage_estimator": "advantage estimator: rloo_n | rloo | grpo | maxrl | reinforce_pp "
                                             "(= reinforce++) | gae (creates a critic)",
    "trainer.algorithm.group_advantage_min_size": "rloo_n: a group with fewer eligible members gets advantage 0",
    "trainer.algorithm.grpo_norm_by_std": "grpo: divide the centred rewards by the group std (False = Dr. GRPO)",
    "trainer.algorithm.gamma": "discount of the returns in [0, 1] (reinforce_pp, gae, reported returns)",
    "trainer.algorithm.lambd": "GAE lambda in [0, 1] (1 = Monte-Carlo return - V, 0 = one-step TD)",
    "trainer.algorithm.value_clip": "gae critic loss: V is clipped to V_old +- value_clip; 0 = unclipped",
    "trainer.algorithm.policy_loss_type": "policy loss: regular (PPO clip) | dual_clip | gspo | cispo | sapo | "
                                          "clip_cov | kl_cov",
    "trainer.algorithm.loss_reduction": "token terms to one scalar: token_mean | sequence_mean | "
                                        "seq_mean_token_sum_norm",
    "trainer.algorithm.eps_clip_low": "PPO clip: the ratio is clipped below at 1 - eps_clip_low",
    "trainer.algorithm.eps_clip_high": "PPO clip: the ratio is clipped above at 1 + eps_clip_high",
    "trainer.algorithm.clip_ratio_c": "dual-clip bound c > 1 on negative advantages (policy_loss_type=dual_clip)",
    "trainer.algorithm.max_seq_len": "tokens per sequence seq_mean_token_sum_norm divides by; caps trajectories; "
                                     "0 = unset",
    "trainer.algorithm.temperature": "temperature of the trainer's logprobs (logits / T)",
    "trainer.algorithm.allow_temperature_mismatch": "accept a trainer temperature that differs from the rollouts'",
    "trainer.algorithm.use_kl_loss": "add kl_loss_coef x KL(policy || reference) to the loss (needs kl_loss_coef > 0)",
    "trainer.algorithm.kl_loss_coef": "KL coefficient (in the loss, or the initial beta of use_kl_in_reward); "
                                      "0 = no reference model",
    "trainer.algorithm.use_kl_in_reward": "subtract beta x KL(pi_old || reference) from the token rewards instead "
                                          "(set use_kl_loss=False)",
    "trainer.algorithm.kl_estimator_type": "KL estimator: k1 | k2 | k3 | abs",
    "trainer.algorithm.kl_ctrl.type": "KL-in-reward coefficient beta: fixed (= kl_loss_coef) | adaptive (towards "
                                      "kl_target)",
    "trainer.algorithm.kl_ctrl.kl_target": "adaptive KL controller: the target per-token KL",
    "trainer.algorithm.kl_ctrl.horizon": "adaptive KL controller: trajectories over which beta adapts (larger = "
                                         "slower)",
    "trainer.algorithm.entropy_loss_coef": "coefficient of the entropy bonus; 0 = off",
    "trainer.algorithm.cispo.cispo_eps_clip_low": "cispo: the IS weight is clamped below at 1 - cispo_eps_clip_low",
    "trainer.algorithm.cispo.cispo_eps_clip_high": "cispo: the IS weight is clamped above at 1 + cispo_eps_clip_high",
    "trainer.algorithm.cispo.cispo_anchor": "cispo: ratio anchor old (pi/pi_old) | rollout (pi/mu; no TIS then)",
    "trainer.algorithm.sapo.tau_pos": "sapo: gate temperature for positive advantages",
    "trainer.algorithm.sapo.tau_neg": "sapo: gate temperature for zero or negative advantages",
    "trainer.algorithm.clip_cov.clip_ratio": "clip_cov: fraction of loss tokens whose gradient is cut",
    "trainer.algorithm.clip_cov.clip_cov_lb": "clip_cov: lower bound of the covariance of a cut token",
    "trainer.algorithm.clip_cov.clip_cov_ub": "clip_cov: upper bound of the covariance of a cut token",
    "trainer.algorithm.kl_cov.kl_cov_frac": "kl_cov: fraction of loss tokens (largest covariance) with the KL penalty",
    "trainer.algorithm.kl_cov.ppo_kl_coef": "kl_cov: coefficient of |log pi - log pi_old| on those tokens",
    "trainer.algorithm.off_policy_correction.tis_ratio_type": "truncated importance sampling of pi_old / mu: '' "
                                                              "(off) | token | sequence",
    "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high": "cap of the token-level TIS ratio",
    "trainer.algorithm.off_policy_correction.sequence_tis_ratio_clip_high": "cap of the sequence-level TIS ratio",
    "trainer.algorithm.off_policy_correction.only_untruncated": "apply TIS and its masks only to trajectories "
                                                                "not cut by a length limit",
    "trainer.algorithm.off_policy_correction.outlier_token_is_threshold_low": "drop a trajectory with any token "
                                                                              "rho = pi_old/mu below this; 0 = off",
    "trainer.algorithm.off_policy_correction.outlier_token_is_threshold_high": "drop a trajectory with any token "
                                                                               "rho above this; 0 = off",
    "trainer.algorithm.off_policy_correction.token_mask_is_threshold_low": "drop tokens with rho below this (set "
                                                                           "with _high); 0 = off",
    "trainer.algorithm.off_policy_correction.token_mask_is_threshold_high": "drop tokens with rho above this (set "
                                                                            "with _low); 0 = off",
    "trainer.algorithm.off_policy_correction.sequence_mask_metric": "drop trajectories by their rho: '' (off) | "
                                                                    "geometric (mean) | product",
    "trainer.algorithm.off_policy_correction.geo_mask_low": "geometric mask: keep a trajectory with mean rho >= this",
    "trainer.algorithm.off_policy_correction.geo_mask_high": "geometric mask: keep a trajectory with mean rho <= this",
    "trainer.algorithm.off_policy_correction.product_mask_low": "product mask: keep a trajectory with prod rho >= this",
    "trainer.algorithm.off_policy_correction.product_mask_high": "product mask: keep a trajectory with prod rho <= this",
    "trainer.critic.model.path": "HF Qwen3 checkpoint of the critic's trunk (gae only); '' = the policy's",
    "trainer.critic.optimizer.lr": "critic AdamW learning rate (betas, eps, schedule, offload: trainer.optimizer)",
    "trainer.critic.optimizer.weight_decay": "critic AdamW decoupled weight decay",
    "trainer.critic.optimizer.max_grad_norm": "critic global gradient-norm clip",
    "trainer.async_rl.mode": "sync (generate, then train) | one_step (generator one batch ahead) | fully_async",
    "trainer.async_rl.max_staleness_steps": "fully_async: a group is trained only while its oldest token is <= this "
                                         "many versions old",
    "trainer.async_rl.max_in_flight_trajectories": "fully_async: trajectories generating at once; 0 = (staleness + 1) "
                                                "x B x n",
    "trainer.async_rl.stale_action": "a group older than the bound is dropped and counted | regenerated",
    "trainer.collapse.enabled": "detect a reward collapse: the EMA below its best by drop for patience steps",
    "trainer.collapse.drop": "collapse: drop of the reward EMA below its best (absolute reward)",
    "trainer.collapse.patience": "collapse: consecutive steps below best - drop",
    "trainer.collapse.action": "on a collapse: stop | rollback (to the best checkpoint, with a lower lr)",
    "trainer.collapse.lr_factor": "rollback: new lr = lr x lr_factor",
    "trainer.collapse.max_rollbacks": "rollbacks before a collapse stops the run",
}

# Element types of tuple-valued keys whose default is empty (the others take their default's).
_TUPLE_ITEM_TYPES: dict[str, type] = {"generator.sidecar_urls": str}


def flatten(c, prefix: str = "") -> dict[str, Any]:
    """`{"a.b.c": value}` of every leaf of a ConfigDict or nested dict, in sorted key order."""
    out: dict[str, Any] = {}
    for k in sorted(c.keys()):
        v = c[k]
        if isinstance(v, (ml_collections.ConfigDict, dict)):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def key_type(key: str, value: Any) -> str:
    """The type of a config value as `show` prints it: int, float, str, bool, tuple[int], ..."""
    if isinstance(value, (tuple, list)):
        items = {type(v).__name__ for v in value}
        if not items:
            default = flatten(base_config()).get(key)
            items = {type(v).__name__ for v in default or ()} or (
                {_TUPLE_ITEM_TYPES[key].__name__} if key in _TUPLE_ITEM_TYPES else set())
        return f"tuple[{' | '.join(sorted(items))}]" if items else "tuple"
    return "None" if value is None else type(value).__name__


def nearest_key(key: str, keys) -> Optional[str]:
    """The valid key a mistyped dotted `key` most likely meant, or None.

    A key with the same last component wins (`trainer.lr` -> `trainer.optimizer.lr`), the one
    whose full path is closest if several do; otherwise the closest full path, then the closest
    last component (difflib similarity >= 0.6).
    """
    import difflib

    keys = list(keys)
    leaf = key.rsplit(".", 1)[-1]
    ratio = lambda k: difflib.SequenceMatcher(None, key, k).ratio()
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return max(same_leaf, key=ratio)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if close:
        return close[0]
    leaves = {k.rsplit(".", 1)[-1]: k for k in keys}
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)
    return leaves[close[0]] if close else None


def key_sections(keys) -> set[str]:
    """Every section above the dotted leaf `keys` (`trainer`, `trainer.optimizer`, ...)."""
    return {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}


def unknown_key_hint(key: str, keys, sections: bool = False) -> str:
    """What to say about a `key` that is not one of the dotted leaf `keys`: `did you mean `K`?` with
    the nearest key (`nearest_key`; with `sections`, sections such as `trainer.optimizer` are
    candidates too), or, when none is close, the top-level names to start from."""
    keys = list(keys)
    near = nearest_key(key, [*keys, *sorted(key_sections(keys))] if sections else keys)
    if near:
        return f"did you mean `{near}`?"
    top = sorted({k.split(".", 1)[0] for k in keys})
    return f"no key is close to it; the top-level keys are {', '.join(top)}."


def recipe_error(e: BaseException, path: str) -> Optional[ConfigError]:
    """A one-line error naming the file and line of a recipe that failed to load, or None.

    `e` is what loading the recipe file `path` raised (compiling it, running it, or its
    `get_config`), or an exception chained to it (ml_collections re-raises a recipe's TypeError /
    ValueError with the traceback as text, and defers an OSError behind another): a SyntaxError
    names its own file and line; any other exception the last line of `path` in its traceback.
    None when no exception of the chain came from `path`. A ConfigError in the chain (jaxrl's own
    one-line error with its fix, such as an unknown scale) is returned as it is: the recipe's line
    that called into jaxrl is not where the problem is.
    """
    import traceback

    target = os.path.realpath(path)
    seen: set[int] = set()
    chain: list[BaseException] = []
    err: Optional[BaseException] = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    own = [x for x in chain if isinstance(x, ConfigError)]
    if own:  # the innermost: ml_collections re-raises it with the traceback in the message
        return ConfigError(" ".join(str(own[-1]).split()))
    for err in chain:
        if isinstance(err, SyntaxError) and err.filename and os.path.isfile(err.filename):
            where, line, text = err.filename, err.lineno, err.msg
        else:
            line = None
            for frame, lineno in traceback.walk_tb(err.__traceback__):
                if os.path.realpath(frame.f_code.co_filename) == target:
                    line = lineno
            where, text = path, " ".join(str(err).split())
        if line is not None:
            return ConfigError(f"--config: recipe file {where}, line {line}: {type(err).__name__}: {text}. "
                               f"Fix: correct line {line} of {where}")
    return None


RECIPE_FIX = "Fix: pass a recipe such as configs/rloo.py (or configs/rloo.py:qwen3_8b)"


def recipe_file_problem(path: str) -> Optional[str]:
    """Why `path` cannot be a recipe file, checked without running it, or None: a directory, a
    file whose name does not end in .py, or a Python file with no ``def get_config`` (a missing
    file is reported where it is loaded)."""
    if os.path.isdir(path):
        return f"{path!r} is a directory, not a recipe file. {RECIPE_FIX}"
    if not os.path.isfile(path):
        return None
    if not path.endswith(".py"):
        return f"{path!r} is not a Python recipe file (.py with get_config()). {RECIPE_FIX}"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        return f"recipe file {path!r} cannot be read ({e}). {RECIPE_FIX}"
    if not re.search(r"^\s*def\s+get_config\s*\(", text, re.M):
        return f"recipe file {path!r} defines no get_config(), so it is not a recipe. {RECIPE_FIX}"
    return None


def load_recipe(spec: str) -> ml_collections.ConfigDict:
    """The config of a recipe spec `path/to/recipe.py[:scale]` (what --config=... loads).

    Raises:
      ConfigError: the file does not exist, is not a Python file with `get_config`, the
        scale is unknown, or the file has a syntax error or its code raises (`recipe_error`:
        the file and line).
    """
    import importlib.util

    path, sep, arg = spec.partition(":")
    if not os.path.exists(path):
        raise ConfigError(f"recipe file {path!r} does not exist. {RECIPE_FIX}")
    problem = recipe_file_problem(path)
    if problem:
        raise ConfigError(problem)
    name = "jaxrl_recipe_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        return module.get_config(arg) if sep else module.get_config()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the recipe's own code, reported with its line
        error = recipe_error(e, path)
        if error is None:
            raise
        raise error from None


def _a(noun: str) -> str:
    """`noun` with its indefinite article ("an int", "a str")."""
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _check_types(c: ml_collections.ConfigDict) -> None:
    """Tuple-valued keys hold elements of their default's type (a command-line override such as
    `--config.trainer.seq_len_buckets=abc` parses as ('abc',) without complaint)."""
    base = flatten(base_config())
    for key, value in flatten(c).items():
        default = base.get(key)
        if not isinstance(default, tuple) or not isinstance(value, (tuple, list)):
            continue
        want = type(default[0]) if default else _TUPLE_ITEM_TYPES.get(key)
        if want is None:
            continue
        ok = (int, float) if want is float else (want,)
        bad = [v for v in value if not isinstance(v, ok) or isinstance(v, bool) and want is not bool]
        _require(not bad, key, f"{tuple(value)!r} holds {bad[0]!r}, which is not {_a(want.__name__)}" if bad else "",
                 f"pass a tuple of {want.__name__} values, e.g. --config.{key}='{tuple(default) or ('x',)!r}'")


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


def _require(cond: bool, key: str, problem: str, fix: str):
    if not cond:
        raise ConfigError(key, problem, fix)


def _check_model_input(c: ml_collections.ConfigDict) -> None:
    if c.scale != "cpu":
        _require(bool(c.model.path), "model.path", f"the {c.scale} scale needs an HF checkpoint",
                 "pass --config.model.path=/path/to/Qwen3-8B (a directory with config.json and *.safetensors)")
    if c.model.path:
        problem = hf_checkpoint_problem(c.model.path)
        _require(problem is None, "model.path", problem, f"point it at {HF_CHECKPOINT_HINT}, or use '' for the "
                 "embedded default policy")
        problem = tokenizer_problem(c.model.path)
        _require(problem is None, "model.path", problem, "copy the tokenizer files of the model it was trained from "
                 "into it")


def check_inputs_first(c: ml_collections.ConfigDict) -> None:
    """The checks of `validate` that need no JAX, run by `jaxrl.main` before it imports JAX (a
    bad path is then reported in about a second, not after 17-31 s of imports): key types, the
    model checkpoint (`model.path`), a dataset file (`data.task=dataset`) and a held-out file.
    Raises: ConfigError, with the message `validate` gives for the same problem."""
    _check_types(c)
    _check_model_input(c)
    if c.data.task == "dataset":
        _require(bool(c.data.dataset_path) and os.path.exists(c.data.dataset_path), "data.dataset_path",
                 f"{c.data.dataset_path!r} does not exist", "point it at a .jsonl or .parquet prompt file")
    if c.data.eval_dataset_path and c.data.task == "dataset":
        _require(os.path.isfile(c.data.eval_dataset_path), "data.eval_dataset_path",
                 f"{c.data.eval_dataset_path!r} does not exist", "point it at a .jsonl or .parquet prompt file")


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None, check_inputs: bool = True,
             platform: str | None = None) -> None:
    """Checks a run config before any work starts.

    Args:
      c: the resolved config (after command-line overrides).
      num_devices: devices the mesh must cover; None skips the mesh/device checks.
      check_inputs: check the run's external inputs — `model.path` names a checkpoint, the
        dataset file exists, vLLM sidecar URLs are given (False for `jaxrl.plan`, which compiles
        from the config's shapes only).
      platform: the JAX backend the run uses ("cpu", "gpu", ...); on "gpu" the GPU memory shares
        of the processes on one GPU must fit (jaxrl/gpu_memory.py).

    Raises:
      ConfigError: naming the first offending key, the problem and the fix.
    """
    from jaxrl.rl import loss_config as rl_loss_config
    from jaxrl.rl import registry as rl_registry  # names of estimators, losses, reductions

    valid_names = {
        "advantage_estimator": rl_registry.ADVANTAGE_ESTIMATORS,
        "policy_loss": rl_registry.POLICY_LOSSES,
        "loss_reduction": rl_registry.LOSS_REDUCTIONS,
        "kl_estimator": rl_loss_config.KL_ESTIMATORS,
    }
    _check_types(c)
    t, a, g = c.trainer, c.trainer.algorithm, c.generator
    if check_inputs:
        _check_model_input(c)
    # Algorithm names.
    for key, value, kind in (
        ("trainer.algorithm.advantage_estimator", a.advantage_estimator, "advantage_estimator"),
        ("trainer.algorithm.policy_loss_type", a.policy_loss_type, "policy_loss"),
        ("trainer.algorithm.loss_reduction", a.loss_reduction, "loss_reduction"),
        ("trainer.algorithm.kl_estimator_type", a.kl_estimator_type, "kl_estimator"),
    ):
        names = valid_names[kind]
        _require(value in names, key, f"unknown name {value!r}", f"use one of {sorted(names)}")
    # Clip ranges.
    _require(0.0 < a.eps_clip_low < 1.0, "trainer.algorithm.eps_clip_low",
             f"{a.eps_clip_low} is outside (0, 1)", "use e.g. 0.2 (the ratio is clipped below at 1 - eps_clip_low)")
    _require(0.0 < a.eps_clip_high <= 10.0, "trainer.algorithm.eps_clip_high",
             f"{a.eps_clip_high} is outside (0, 10]", "use e.g. 0.05 or 0.2 (clipped above at 1 + eps_clip_high)")
    _require(a.clip_ratio_c > 1.0, "trainer.algorithm.clip_ratio_c",
             f"{a.clip_ratio_c} must be > 1", "use e.g. 3.0 (dual-clip bound on negative advantages)")
    if a.loss_reduction.startswith("seq_mean_token_sum_norm"):
        _require(a.max_seq_len and a.max_seq_len > 0, "trainer.algorithm.max_seq_len",
                 "seq_mean_token_sum_norm needs an explicit constant max_seq_len (it is never the padded width)",
                 "set --config.trainer.algorithm.max_seq_len to the total token budget per sequence, e.g. 32768")
    _require(a.temperature > 0, "trainer.algorithm.temperature", f"{a.temperature} must be > 0",
             "use the sampling temperature, e.g. 1.0")
    _require(a.kl_loss_coef >= 0, "trainer.algorithm.kl_loss_coef", "must be >= 0", "use 0 to disable KL")
    _require(a.entropy_loss_coef >= 0, "trainer.algorithm.entropy_loss_coef", "must be >= 0",
             "use 0 to disable the entropy bonus")
    _require(a.group_advantage_min_size >= 2, "trainer.algorithm.group_advantage_min_size", "must be >= 2",
             "use 2 (RLOO needs at least one other member)")
    opc = a.off_policy_correction
    _require(opc.tis_ratio_type in ("", "token", "sequence"), "trainer.algorithm.off_policy_correction.tis_ratio_type",
             f"unknown type {opc.tis_ratio_type!r}", "use '', 'token' or 'sequence'")
    _require(opc.token_tis_ratio_clip_high > 0 and opc.sequence_tis_ratio_clip_high > 0,
             "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high", "TIS caps must be > 0",
             "use e.g. 2.0 (token) and 5.0 (sequence)")
    _validate_algorithm(c)
    if c.trainer.critic.model.path and check_inputs and needs_critic(c):
        problem = hf_checkpoint_problem(c.trainer.critic.model.path)
        _require(problem is None, "trainer.critic.model.path", problem,
                 f"point it at a Qwen3 checkpoint, {HF_CHECKPOINT_HINT}, or use '' for the policy's")
    # Batch sizes (SkyRL semantics: train/mini in prompts, micro in sequences).
    for key in ("train_batch_size", "mini_batch_size", "micro_batch_size", "update_epochs_per_batch", "num_steps"):
        _require(int(t[key]) >= 1, f"trainer.{key}", f"{t[key]} must be >= 1", "use a positive integer")
    _require(g.n_samples_per_prompt >= 1, "generator.n_samples_per_prompt", "must be >= 1", "use e.g. 8")
    _require(t.train_batch_size % t.mini_batch_size == 0, "trainer.mini_batch_size",
             f"train_batch_size={t.train_batch_size} is not a multiple of mini_batch_size={t.mini_batch_size}",
             f"set trainer.mini_batch_size to a divisor of {t.train_batch_size} (e.g. {t.train_batch_size}), or "
             f"trainer.train_batch_size to a multiple of {t.mini_batch_size}")
    seqs_per_mini = t.mini_batch_size * g.n_samples_per_prompt
    _require(seqs_per_mini % t.micro_batch_size == 0, "trainer.micro_batch_size",
             f"a mini-batch has mini_batch_size*n_samples_per_prompt={seqs_per_mini} sequences, "
             f"not a multiple of micro_batch_size={t.micro_batch_size}",
             f"set trainer.micro_batch_size to a divisor of {seqs_per_mini}, or change mini_batch_size or "
             f"generator.n_samples_per_prompt so that their product is a multiple of {t.micro_batch_size}")
    _require(t.ema_span >= 1, "trainer.ema_span", "must be >= 1", "use 5")
    _require(t.ckpt_interval >= 1, "trainer.ckpt_interval", "must be >= 1", "use e.g. 5")
    _require(t.max_ckpts_to_keep >= 1, "trainer.max_ckpts_to_keep", "must be >= 1", "use e.g. 2")
    _require(t.eval_interval >= 0, "trainer.eval_interval", "must be >= 0", "use 0 to evaluate only at the ends")
    _require(math.isfinite(t.success_threshold), "trainer.success_threshold", f"{t.success_threshold} is not finite",
             "use the reward of a solved task, e.g. 1.0")
    _require(t.logprob_diff_warn_threshold >= 0 or t.logprob_diff_warn_threshold == -1,
             "trainer.logprob_diff_warn_threshold", f"{t.logprob_diff_warn_threshold} is not a bound",
             "use a bound >= 0 (0 never warns), or -1 for the compute dtype's default (1e-3 float32, 1.0 bfloat16)")
    o = t.optimizer
    _require(o.lr > 0 and math.isfinite(o.lr), "trainer.optimizer.lr", f"{o.lr} must be a positive number",
             "use e.g. 8e-6 (the Qwen3-8B recipes) or 1e-4 (the CPU recipe's tiny policy)")
    _require(o.max_grad_norm > 0, "trainer.optimizer.max_grad_norm", "must be > 0", "use e.g. 1.0")
    _require(o.scheduler in ("constant", "cosine"), "trainer.optimizer.scheduler",
             f"unknown scheduler {o.scheduler!r}", "use 'constant' or 'cosine'")
    _require(o.num_warmup_steps >= 0, "trainer.optimizer.num_warmup_steps", "must be >= 0", "use 0")
    _require(o.offload in ("none", "moments", "moments_and_master"), "trainer.optimizer.offload",
             f"unknown placement {o.offload!r}", "use 'none', 'moments' or 'moments_and_master'")
    col = t.collapse
    _require(col.action in ("stop", "rollback"), "trainer.collapse.action", f"unknown action {col.action!r}",
             "use 'stop' or 'rollback'")
    _require(col.drop > 0 and col.patience >= 1, "trainer.collapse.drop",
             "drop must be > 0 and patience >= 1", "use e.g. drop=0.2, patience=3")
    _require(0 < col.lr_factor <= 1, "trainer.collapse.lr_factor", "must be in (0, 1]", "use e.g. 0.5")
    # Generation.
    sp = g.sampling_params
    _require(sp.max_generate_length >= 1, "generator.sampling_params.max_generate_length", "must be >= 1", "use e.g. 1024")
    from jaxrl.rollout.types import MIN_TEMPERATURE  # the engine's bound (float32 logits / temperature)
    for key, temp in (("generator.sampling_params.temperature", sp.temperature),
                      ("generator.eval_sampling_params.temperature", g.eval_sampling_params.temperature)):
        _require(MIN_TEMPERATURE <= temp < math.inf, key, f"{temp} must be finite and >= {MIN_TEMPERATURE}",
                 "use 1.0 (for argmax decoding set greedy instead)")
    _require(a.temperature == g.sampling_params.temperature or a.allow_temperature_mismatch,
             "trainer.algorithm.temperature",
             f"{a.temperature} differs from generator.sampling_params.temperature={g.sampling_params.temperature}: "
             "the trainer's logprobs would describe another distribution than the one the rollouts were sampled "
             "from (every importance ratio is off)",
             "set both to the same value, or pass --config.trainer.algorithm.allow_temperature_mismatch=True "
             "to train against a different temperature on purpose")
    _require(0 < sp.top_p <= 1, "generator.sampling_params.top_p", "must be in (0, 1]", "use 1.0")
    _require(g.backend in ("jax", "vllm"), "generator.backend", f"unknown backend {g.backend!r}", "use 'jax' or 'vllm'")
    if g.backend == "vllm" and check_inputs:
        _require(len(g.sidecar_urls) > 0, "generator.sidecar_urls", "backend=vllm needs the URLs of running sidecars",
                 "start them with launch/vllm_sidecar.sh and pass --config.generator.sidecar_urls")
    _require(g.max_turns >= 1, "generator.max_turns", "must be >= 1", "use 1 for single-turn tasks")
    _require(isinstance(g.execute_truncated_turns, bool), "generator.execute_truncated_turns", "must be True or False",
             "use False (a cut turn's tool calls never run) unless every tool is free of side effects")
    _require(g.num_sidecars >= 1, "generator.num_sidecars", "must be >= 1", "use 1 on a CPU")
    _require(g.chat_template in ("", "keep_thinking"), "generator.chat_template",
             f"unknown value {g.chat_template!r}", "use keep_thinking (past <think> blocks kept, as the seed runs' "
             "template) or '' (the checkpoint's chat template)")
    _require(sp.top_k == -1 or sp.top_k >= 0, "generator.sampling_params.top_k", f"{sp.top_k} is not a valid top-k",
             "use -1 (or 0) to disable top-k, or a positive k")
    _validate_logprobs_mode(c)
    _validate_async(c)
    from jaxrl import gpu_memory

    gpu_memory.check_keys(c)
    if platform == "gpu":
        gpu_memory.check_shares(c)
    _require(c.data.num_eval_prompts >= 0, "data.num_eval_prompts", "must be >= 0", "use 0 to skip evaluation")
    _require(c.data.max_prompt_length >= 1, "data.max_prompt_length", "must be >= 1", "use e.g. 512")
    _require(col.max_rollbacks >= 0, "trainer.collapse.max_rollbacks", "must be >= 0", "use 0 to never roll back")
    need = rollout_max_seq_len(c)
    _require(len(t.seq_len_buckets) > 0 and max(t.seq_len_buckets) >= need, "trainer.seq_len_buckets",
             f"the largest bucket {max(t.seq_len_buckets, default=0)} is shorter than the longest possible "
             f"trajectory ({need} tokens = data.max_prompt_length + generator.max_turns x max_generate_length, "
             "capped by trainer.algorithm.max_seq_len)", f"add a bucket >= {need}")
    from jaxrl.envs import TASK_REGISTRY

    for key in ("data.task", "data.eval_task"):
        name = c.data.task if key == "data.task" else c.data.eval_task
        if name and not (key == "data.task" and name in ("dataset", "harbor")):
            _require(name in TASK_REGISTRY, key, f"unknown task {name!r}",
                     f"use one of {sorted(TASK_REGISTRY)}" + (", 'dataset' or 'harbor'" if key == "data.task" else ""))
    _validate_harbor(c, check_inputs)
    # Model / data.
    _require(c.model.compute_dtype in ("float32", "bfloat16"), "model.compute_dtype",
             f"unknown dtype {c.model.compute_dtype!r}", "use 'float32' or 'bfloat16'")
    _require(c.model.remat in ("none", "full", "save_dots", "save_attention", "save_dots_attention"), "model.remat",
             f"unknown policy {c.model.remat!r}",
             "use 'none', 'full', 'save_dots', 'save_attention' or 'save_dots_attention'")
    _require(isinstance(c.model.logprobs_save_probs, bool), "model.logprobs_save_probs", "must be True or False",
             "use --config.model.logprobs_save_probs=True or False")
    _require(c.model.attention_impl in ("xla", "cudnn", "splash"), "model.attention_impl",
             f"unknown implementation {c.model.attention_impl!r}",
             "use 'xla' (any backend), 'cudnn' (NVIDIA GPU) or 'splash' (TPU)")
    if c.data.task in ("dataset", "harbor") and check_inputs:
        from jaxrl.envs.harbor.dataset import spec_exists

        _require(bool(c.data.dataset_path) and spec_exists(c.data.dataset_path), "data.dataset_path",
                 f"{c.data.dataset_path!r} does not exist",
                 "point it at a .jsonl or .parquet prompt file" if c.data.task == "dataset" else
                 "point it at a Harbor task directory, a folder of tasks, a DCAgent .parquet, or use "
                 "family:<name>:<first>-<last>")
    _require(0.0 <= c.data.eval_fraction < 1.0, "data.eval_fraction", f"{c.data.eval_fraction} is outside [0, 1)",
             "use e.g. 0.05 (5% of the training file's prompts held out), or 0 for none")
    _require(not (c.data.eval_dataset_path and c.data.eval_task), "data.eval_dataset_path",
             f"both data.eval_dataset_path={c.data.eval_dataset_path!r} and data.eval_task={c.data.eval_task!r} "
             "are set", "keep one held-out set: drop data.eval_task or data.eval_dataset_path")
    if c.data.eval_dataset_path and check_inputs and not _is_harbor_run(c):
        _require(os.path.isfile(c.data.eval_dataset_path), "data.eval_dataset_path",
                 f"{c.data.eval_dataset_path!r} does not exist", "point it at a .jsonl or .parquet prompt file")
    _require(c.data.task in ("dataset", "harbor") or not c.data.dataset_path, "data.dataset_path",
             f"{c.data.dataset_path!r} is set but data.task={c.data.task!r} does not read it (it trains on the "
             "built-in task)", "add --config.data.task=dataset to train on the file, or drop data.dataset_path")
    # Mesh.
    axes = [int(c.mesh.data), int(c.mesh.fsdp), int(c.mesh.tensor)]
    for name, v in zip(("data", "fsdp", "tensor"), axes):
        _require(v == -1 or v >= 1, f"mesh.{name}", f"{v} is not a size", "use a positive size or -1 (all remaining devices)")
    _require(axes.count(-1) <= 1, "mesh", "at most one axis may be -1", "set the other axes explicitly")
    if num_devices is not None:
        known = math.prod(v for v in axes if v != -1)
        if num_devices % known == 0:
            sizes = [num_devices // known if v == -1 else v for v in axes]
            rows_axis = sizes[0] * sizes[1]
            _require(t.micro_batch_size % rows_axis == 0, "trainer.micro_batch_size",
                     f"{t.micro_batch_size} sequences do not split over data x fsdp = {rows_axis} devices",
                     f"use a multiple of {rows_axis} that divides {seqs_per_mini}")
        if not (num_devices % known == 0 and (-1 in axes or known == num_devices)):
            from jaxrl.parallel import mesh_hint

            shape = " x ".join(f"{n}={v}" for n, v in zip(("data", "fsdp", "tensor"), axes))
            raise ConfigError("mesh", f"mesh {shape} does not fit the {num_devices} available devices",
                              mesh_hint(*axes, num_devices))


# trainer.algorithm.* key (relative) -> (LossConfig field, conversion): every LossConfig field is
# reachable from a run config through this table (tests/test_config.py checks it covers them all).
_OFF = lambda v: v or None  # noqa: E731  "" / 0 = off -> None
LOSS_CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "policy_loss_type": ("policy_loss_type", str),
    "loss_reduction": ("loss_reduction", str),
    "max_seq_len": ("max_seq_len", lambda v: int(v) or None),
    "eps_clip_low": ("eps_clip_low", float),
    "eps_clip_high": ("eps_clip_high", float),
    "clip_ratio_c": ("clip_ratio_c", float),
    "cispo.cispo_eps_clip_low": ("cispo_eps_clip_low", float),
    "cispo.cispo_eps_clip_high": ("cispo_eps_clip_high", float),
    "cispo.cispo_anchor": ("cispo_anchor", str),
    "sapo.tau_pos": ("sapo_tau_pos", float),
    "sapo.tau_neg": ("sapo_tau_neg", float),
    "clip_cov.clip_ratio": ("clip_cov_ratio", float),
    "clip_cov.clip_cov_lb": ("clip_cov_lb", float),
    "clip_cov.clip_cov_ub": ("clip_cov_ub", float),
    "kl_cov.kl_cov_frac": ("kl_cov_frac", float),
    "kl_cov.ppo_kl_coef": ("ppo_kl_coef", float),
    "use_kl_loss": ("use_kl_loss", bool),
    "kl_loss_coef": ("kl_loss_coef", float),
    "kl_estimator_type": ("kl_estimator_type", str),
    "entropy_loss_coef": ("entropy_loss_coef", float),
    "off_policy_correction.tis_ratio_type": ("tis_ratio_type", _OFF),
    "off_policy_correction.token_tis_ratio_clip_high": ("token_tis_ratio_clip_high", float),
    "off_policy_correction.sequence_tis_ratio_clip_high": ("sequence_tis_ratio_clip_high", float),
    "off_policy_correction.only_untruncated": ("only_untruncated", bool),
    "off_policy_correction.outlier_token_is_threshold_low": ("outlier_token_is_threshold_low", _OFF),
    "off_policy_correction.outlier_token_is_threshold_high": ("outlier_token_is_threshold_high", _OFF),
    "off_policy_correction.token_mask_is_threshold_low": ("token_mask_is_threshold_low", _OFF),
    "off_policy_correction.token_mask_is_threshold_high": ("token_mask_is_threshold_high", _OFF),
    "off_policy_correction.sequence_mask_metric": ("sequence_mask_metric", _OFF),
    "off_policy_correction.geo_mask_low": ("geo_mask_low", float),
    "off_policy_correction.geo_mask_high": ("geo_mask_high", float),
    "off_policy_correction.product_mask_low": ("product_mask_low", float),
    "off_policy_correction.product_mask_high": ("product_mask_high", float),
}
# trainer.algorithm.* key -> AdvantageConfig field (every field; same check).
ADVANTAGE_CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "advantage_estimator": ("advantage_estimator", str),
    "grpo_norm_by_std": ("grpo_norm_by_std", bool),
    "group_advantage_min_size": ("group_advantage_min_size", int),
    "gamma": ("gamma", float),
    "lambd": ("lambd", float),
}


def _algorithm_value(c: ml_collections.ConfigDict, key: str):
    node = c.trainer.algorithm
    for part in key.split("."):
        node = node[part]
    return node


def loss_config(c: ml_collections.ConfigDict):
    """The `jaxrl.rl.LossConfig` of a run config (`trainer.algorithm.*`, `LOSS_CONFIG_KEYS`).

    With `use_kl_in_reward` the KL enters the rewards, not the loss (kl_loss_coef is then the
    controller's initial beta), so the loss's KL term is off.
    Raises: ConfigError naming the key when LossConfig rejects a value.
    """
    from jaxrl.rl.loss_config import LossConfig

    kwargs = {field: conv(_algorithm_value(c, key)) for key, (field, conv) in LOSS_CONFIG_KEYS.items()}
    if c.trainer.algorithm.use_kl_in_reward:
        kwargs["use_kl_loss"] = False
    return _build(LossConfig, kwargs, LOSS_CONFIG_KEYS)


def advantage_config(c: ml_collections.ConfigDict):
    """The `jaxrl.rl.AdvantageConfig` of a run config (`ADVANTAGE_CONFIG_KEYS`).
    Raises: ConfigError naming the key when AdvantageConfig rejects a value."""
    from jaxrl.rl.advantages import AdvantageConfig

    kwargs = {field: conv(_algorithm_value(c, key)) for key, (field, conv) in ADVANTAGE_CONFIG_KEYS.items()}
    return _build(AdvantageConfig, kwargs, ADVANTAGE_CONFIG_KEYS)


def _build(cls, kwargs, table):
    try:
        return cls(**kwargs)
    except ValueError as e:  # the dataclass names its field first; report the config key
        text = str(e)
        hits = sorted(((text.find(field), key) for key, (field, _) in table.items() if field in text))
        key = "trainer.algorithm." + (hits[0][1] if hits else "")
        raise ConfigError(key.rstrip("."), text.rstrip("."), "see docs/recipes.md, 'trainer.algorithm keys'") from None


def needs_critic(c: ml_collections.ConfigDict) -> bool:
    """True when the run's advantage estimator needs a value model (the trainer then creates a critic)."""
    from jaxrl.rl import registry

    return registry.estimator_needs_values(c.trainer.algorithm.advantage_estimator)


def needs_reference(c: ml_collections.ConfigDict) -> bool:
    """True when the run needs reference-policy logprobs: a KL loss term or a KL-in-reward penalty."""
    from jaxrl.rl.loss_config import needs_reference_model

    return bool(c.trainer.algorithm.use_kl_in_reward) or needs_reference_model(loss_config(c))


def _validate_algorithm(c: ml_collections.ConfigDict) -> None:
    """The keys added for issue 15 (one-line ConfigError each), then LossConfig / AdvantageConfig as
    a final check of every trainer.algorithm value (their errors are mapped to the key)."""
    a, pre = c.trainer.algorithm, "trainer.algorithm."
    opc = a.off_policy_correction
    for key in ("gamma", "lambd"):
        _require(0.0 <= a[key] <= 1.0, pre + key, f"{a[key]} is outside [0, 1]", "use e.g. 1.0 (SkyRL's default)")
    _require(a.value_clip >= 0, pre + "value_clip", f"{a.value_clip} must be >= 0", "use 0.2, or 0 for an unclipped "
             "value loss")
    _require(a.kl_ctrl.type in ("fixed", "adaptive"), pre + "kl_ctrl.type", f"unknown controller {a.kl_ctrl.type!r}",
             "use 'fixed' or 'adaptive'")
    _require(a.kl_ctrl.kl_target > 0, pre + "kl_ctrl.kl_target", f"{a.kl_ctrl.kl_target} must be > 0", "use e.g. 0.1")
    _require(a.kl_ctrl.horizon > 0, pre + "kl_ctrl.horizon", f"{a.kl_ctrl.horizon} must be > 0", "use e.g. 10000")
    if a.use_kl_in_reward:
        _require(not a.use_kl_loss, pre + "use_kl_in_reward", "the KL penalty is either in the reward or in the loss "
                 "(use_kl_loss=True, the default)", "also pass --config.trainer.algorithm.use_kl_loss=False")
        _require(a.kl_loss_coef > 0, pre + "kl_loss_coef", "use_kl_in_reward takes its initial beta from kl_loss_coef, "
                 "which is 0", "set it to the penalty coefficient, e.g. 0.05")
    _require(a.cispo.cispo_anchor in ("old", "rollout"), pre + "cispo.cispo_anchor",
             f"unknown anchor {a.cispo.cispo_anchor!r}", "use 'old' (pi/pi_old) or 'rollout' (pi/mu)")
    _require(opc.sequence_mask_metric in ("", "geometric", "product"),
             pre + "off_policy_correction.sequence_mask_metric", f"unknown metric {opc.sequence_mask_metric!r}",
             "use '' (off), 'geometric' or 'product'")
    for key in ("outlier_token_is_threshold_low", "outlier_token_is_threshold_high", "token_mask_is_threshold_low",
                "token_mask_is_threshold_high"):
        _require(opc[key] >= 0, pre + "off_policy_correction." + key, f"{opc[key]} must be >= 0",
                 "use a bound on pi_old/mu (e.g. 1e-4 low, 100 high), or 0 to turn it off")
    _require((opc.token_mask_is_threshold_low > 0) == (opc.token_mask_is_threshold_high > 0),
             pre + "off_policy_correction.token_mask_is_threshold_low", "the token mask needs both bounds",
             "set token_mask_is_threshold_low and token_mask_is_threshold_high together (or both to 0)")
    crit = c.trainer.critic
    _require(crit.optimizer.lr > 0 and math.isfinite(crit.optimizer.lr), "trainer.critic.optimizer.lr",
             f"{crit.optimizer.lr} must be a positive number", "use e.g. 5e-6 (SkyRL's default)")
    _require(crit.optimizer.max_grad_norm > 0, "trainer.critic.optimizer.max_grad_norm", "must be > 0", "use e.g. 1.0")
    _require(crit.optimizer.weight_decay >= 0, "trainer.critic.optimizer.weight_decay", "must be >= 0", "use 0")
    loss_config(c)
    advantage_config(c)


ASYNC_MODES = ("sync", "one_step", "fully_async")


def _validate_async(c: ml_collections.ConfigDict) -> None:
    """trainer.async_rl.* and the episode-delay knobs; an asynchronous run whose trajectories can be
    stale needs a rollout-anchored loss (`jaxrl.rl.loss_config.is_rollout_anchored`)."""
    from jaxrl.rl import loss_config as rl_loss_config

    t, ac, g = c.trainer, c.trainer.async_rl, c.generator
    n, B = g.n_samples_per_prompt, t.train_batch_size
    _require(ac.mode in ASYNC_MODES, "trainer.async_rl.mode", f"unknown mode {ac.mode!r}",
             "use 'sync', 'one_step' or 'fully_async'")
    _require(isinstance(ac.max_staleness_steps, int) and ac.max_staleness_steps >= 0,
             "trainer.async_rl.max_staleness_steps", f"{ac.max_staleness_steps!r} is not a step count >= 0",
             "use e.g. 4 (0 = every trained trajectory was sampled by the policy being trained)")
    _require(ac.stale_action in ("drop", "regenerate"), "trainer.async_rl.stale_action",
             f"unknown action {ac.stale_action!r}", "use 'drop' or 'regenerate'")
    _require(math.isfinite(g.episode_delay_s) and g.episode_delay_s >= 0, "generator.episode_delay_s",
             f"{g.episode_delay_s} is not a delay", "use 0 (off) or a number of seconds")
    _require(0 <= g.episode_delay_jitter <= 1, "generator.episode_delay_jitter", f"{g.episode_delay_jitter} is "
             "outside [0, 1]", "use 0 (every episode takes episode_delay_s) up to 1 (uniform in [0, 2 x delay])")
    if ac.mode == "sync":
        return
    _require(t.mini_batch_size == B and t.update_epochs_per_batch == 1, "trainer.mini_batch_size",
             f"trainer.async_rl.mode={ac.mode} publishes one policy version per RL step, which must be one optimizer "
             f"step (train_batch_size={B}, mini_batch_size={t.mini_batch_size}, update_epochs_per_batch="
             f"{t.update_epochs_per_batch})",
             f"set mini_batch_size={B} and update_epochs_per_batch=1 (SkyRL's fully-async trainer requires the same)")
    S = ac.max_staleness_steps
    W = ac.max_in_flight_trajectories
    if ac.mode == "fully_async" and W:
        _require(isinstance(W, int) and W % n == 0 and n <= W <= (S + 1) * B * n,
                 "trainer.async_rl.max_in_flight_trajectories",
                 f"{W} is not a whole number of groups of n_samples_per_prompt={n} between one group and "
                 f"(max_staleness_steps + 1) x train_batch_size x n = {(S + 1) * B * n}",
                 f"use 0 (= {(S + 1) * B * n}) or a multiple of {n} in that range")
    if ac.mode == "one_step" or S > 0:
        try:
            anchored = rl_loss_config.is_rollout_anchored(loss_config(c))
        except ValueError:  # a LossConfig the trainer reports when it builds it
            return
        what = "one_step" if ac.mode == "one_step" else f"fully_async with max_staleness_steps={S}"
        _require(anchored, "trainer.async_rl.mode",
                 f"{what} trains on trajectories sampled by older policy versions (mu != pi_old), and "
                 f"policy_loss_type={c.trainer.algorithm.policy_loss_type!r} without "
                 "off_policy_correction.tis_ratio_type is anchored on pi_old only, so nothing corrects for it",
                 "set --config.trainer.algorithm.off_policy_correction.tis_ratio_type=token (or sequence), or use "
                 "trainer.async_rl.mode=sync or max_staleness_steps=0")


def _is_harbor_run(c: ml_collections.ConfigDict) -> bool:
    """True when the run trains on Harbor tasks: data.task=harbor, or data.task=dataset with a
    dataset_path that is a Harbor task set (a directory, a DCAgent Parquet, a family spec)."""
    if c.data.task == "harbor":
        return True
    if c.data.task != "dataset" or not c.data.dataset_path:
        return False
    from jaxrl.envs.harbor.dataset import is_task_set

    return is_task_set(c.data.dataset_path)


def base_image_pairs(entries) -> tuple:
    """`harbor.base_images` ("name=local image" strings) as ((name, local image), ...).

    Raises:
      ValueError: an entry is not a string of that form.
    """
    if isinstance(entries, str):
        entries = (entries,)
    out, seen = [], {}
    for e in entries or ():
        name, eq, local = str(e).partition("=") if isinstance(e, str) else ("", "", "")
        if not (eq and name.strip() and local.strip()) or "=" in local:
            raise ValueError(f"entry {e!r} is not 'FROM name=local image'")
        name, local = name.strip(), local.strip()
        if name in seen and seen[name] != local:
            raise ValueError(f"{name} is mapped twice ({seen[name]} and {local}); keep one entry per base image")
        seen[name] = local
        out.append((name, local))
    return tuple(out)


def image_cache_config(h):
    """The `image_cache.ImageCacheConfig` of the `harbor.*` image-backend keys."""
    from jaxrl.envs.harbor.image_cache import ImageCacheConfig

    return ImageCacheConfig(base_images=base_image_pairs(h.base_images), cache_dir=h.image_cache_dir or None,
                            max_mb=int(h.image_cache_max_mb), build_concurrency=int(h.build_concurrency),
                            builder=str(h.image_builder))


def _validate_harbor(c: ml_collections.ConfigDict, check_inputs: bool) -> None:
    """The `harbor.*` keys and the Harbor-only `data.*` keys."""
    from jaxrl.envs.harbor.agent import PROMPT_STYLES

    h, d = c.harbor, c.data
    _require(h.prompt_style in PROMPT_STYLES, "harbor.prompt_style", f"unknown style {h.prompt_style!r}",
             f"use one of {list(PROMPT_STYLES)}")
    _require(isinstance(h.strict_json_parser, bool), "harbor.strict_json_parser", "must be True or False",
             "use False (Harbor 0.26's parser) or True")
    _require(isinstance(h.stop_agent_processes, bool), "harbor.stop_agent_processes", "must be True or False",
             "use False (Harbor: the agent's processes run through verification) or True")
    from jaxrl.train.error_policy import ErrorPolicy

    try:
        ErrorPolicy.from_config(h.error_policy)
    except (ValueError, TypeError) as e:
        raise ConfigError("harbor.error_policy", str(e), "use jaxrl's outcome names or Harbor's exception names "
                          "(docs/terminal_tasks.md lists them)") from None
    if h.prompt_style == "terminus-2" and check_inputs and _is_harbor_run(c):
        from jaxrl.envs.harbor.terminus2 import HarborFilesError, terminus2_texts

        try:
            terminus2_texts(str(h.harbor_wheel))
        except HarborFilesError as e:
            raise ConfigError("harbor.harbor_wheel", str(e),
                              "do that, or use harbor.prompt_style=compact (the embedded policy's own prompts)") from None
    for key in ("agent_timeout_sec", "verifier_timeout_sec"):
        v = h[key]
        _require(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, f"harbor.{key}", f"{v!r} is not a duration",
                 "use seconds > 0, or 0 for each task's own value from task.toml")
    _require(h.command_timeout_sec > 0, "harbor.command_timeout_sec", f"{h.command_timeout_sec!r} must be > 0",
             "use 60 (Terminus's cap on one command)")
    _require(int(h.max_output_bytes) >= 64, "harbor.max_output_bytes", f"{h.max_output_bytes!r} is too small",
             "use 10000 (Terminus)")
    _require(int(h.concurrency) >= 0, "harbor.concurrency", f"{h.concurrency!r} must be >= 0",
             "use 0 (one thread per trial, up to max(16, 8 x cores)) or a thread count")
    _require(h.environment_backend in ("profile", "image", "auto"), "harbor.environment_backend",
             f"{h.environment_backend!r} is not a backend", "use 'profile', 'image' or 'auto'")
    try:
        base_image_pairs(h.base_images)
    except ValueError as e:
        raise ConfigError("harbor.base_images", str(e), "use entries like 'ubuntu:24.04=localhost/debian-stand-in:bookworm'") from None
    _require(isinstance(h.image_cache_max_mb, int) and h.image_cache_max_mb > 0, "harbor.image_cache_max_mb",
             f"{h.image_cache_max_mb!r} must be a positive integer", "use 20480 (20 GB) or the disk you can spare")
    _require(h.image_builder in ("buildah", "podman"), "harbor.image_builder", f"{h.image_builder!r} is not a builder",
             "use 'buildah' or 'podman'")
    _require(isinstance(h.build_concurrency, int) and h.build_concurrency >= 1, "harbor.build_concurrency",
             f"{h.build_concurrency!r} must be an integer >= 1", "use 1 on small machines")
    _require(isinstance(h.image_cache_dir, str), "harbor.image_cache_dir", f"{h.image_cache_dir!r} is not a path",
             "use '' (~/.cache/jaxrl/images) or a directory")
    _require(isinstance(h.pip_mirror, str), "harbor.pip_mirror", f"{h.pip_mirror!r} is not a path",
             "use '' (no mirror) or a folder of wheels")
    if h.pip_mirror and check_inputs and _is_harbor_run(c):
        _require(os.path.isdir(h.pip_mirror), "harbor.pip_mirror", f"{h.pip_mirror!r} is not a directory",
                 "make it with `pip download -d DIR PKG==VER ...` (docs/terminal_tasks.md, 'Network'), or use ''")
    _require(isinstance(h.tool_mirror, str), "harbor.tool_mirror", f"{h.tool_mirror!r} is not a path",
             "use '' (no tool mirror) or a folder made by launch/make_tool_mirror.sh")
    if h.tool_mirror and check_inputs and _is_harbor_run(c):
        _require(os.path.isdir(os.path.join(h.tool_mirror, "bin")), "harbor.tool_mirror",
                 f"{h.tool_mirror!r} has no bin/ folder",
                 "make it with `launch/make_tool_mirror.sh DIR --uv VER` (docs/terminal_tasks.md, 'Network'), or use ''")
    _require(isinstance(d.verify_tasks, bool), "data.verify_tasks", "must be True or False",
             "use True to gate Harbor tasks before training")
    _require(c.generator.max_input_tokens >= 0, "generator.max_input_tokens",
             f"{c.generator.max_input_tokens} must be >= 0", "use 0 (no limit besides max_seq_len) or e.g. 32000")
    if d.task == "harbor":
        _require(not d.eval_task, "data.eval_task", f"{d.eval_task!r}: a built-in task cannot evaluate a Harbor run",
                 "drop data.eval_task; give held-out Harbor tasks with data.eval_dataset_path")
    if d.eval_dataset_path and check_inputs and _is_harbor_run(c):
        from jaxrl.envs.harbor.dataset import spec_exists

        _require(spec_exists(d.eval_dataset_path), "data.eval_dataset_path", f"{d.eval_dataset_path!r} does not exist",
                 "point it at a Harbor task directory, folder, DCAgent .parquet or family:<name>:<first>-<last>")


def logprob_diff_warn_threshold(c: ml_collections.ConfigDict) -> float:
    """The bound `trainer.logprob_diff_warn_threshold` stands for (-1: by model.compute_dtype)."""
    t = float(c.trainer.logprob_diff_warn_threshold)
    if t != -1:
        return t
    return 1e-3 if c.model.compute_dtype == "float32" else 1.0


def _validate_logprobs_mode(c: ml_collections.ConfigDict) -> None:
    """generator.logprobs_mode is a known definition that the run's backend can deliver at the
    run's sampling settings (training, and evaluation unless it is greedy)."""
    from jaxrl.rollout import logprob_modes
    from jaxrl.rollout.types import LOGPROBS_MODES

    g, sp, es = c.generator, c.generator.sampling_params, c.generator.eval_sampling_params
    n = es.get("episodes_per_prompt", 1)
    _require(isinstance(n, int) and not isinstance(n, bool) and n >= 1,
             "generator.eval_sampling_params.episodes_per_prompt", f"{n!r} is not a count",
             "use an integer >= 1 (episodes per held-out prompt)")
    _require(g.logprobs_mode in LOGPROBS_MODES, "generator.logprobs_mode", f"unknown mode {g.logprobs_mode!r}",
             "use 'full' (log softmax(logits / T) over the vocabulary, the trainer's definition) or 'sampled' "
             "(the distribution actually sampled, after top-p/top-k)")
    if g.backend == "jax":  # the JAX engine delivers either definition per request
        return
    try:
        vllm_mode = logprob_modes.vllm_mode_for(g.logprobs_mode, sp.temperature, sp.top_p, sp.top_k)
    except ValueError as e:
        raise ConfigError("generator.logprobs_mode", f"{e} (generator.sampling_params.temperature={sp.temperature}, "
                          f"top_p={sp.top_p}, top_k={sp.top_k})",
                          "use generator.logprobs_mode=sampled, or temperature 1, or top_p=1 and top_k=-1") from None
    if not es.greedy:
        gap = logprob_modes.vllm_gap(vllm_mode, g.logprobs_mode, es.temperature, sp.top_p, sp.top_k)
        _require(gap is None, "generator.eval_sampling_params.temperature",
                 f"the vLLM sidecars of this run need --logprobs-mode {vllm_mode} for training, which at the "
                 f"evaluation temperature {es.temperature} does not give {g.logprobs_mode!r} logprobs: {gap}",
                 "evaluate greedily (generator.eval_sampling_params.greedy=True) or at the training temperature")


def rollout_max_seq_len(c: ml_collections.ConfigDict) -> int:
    """Token budget of one trajectory: max_prompt_length + max_turns x max_generate_length, capped
    by `trainer.algorithm.max_seq_len` when that is set."""
    g = c.generator
    n = c.data.max_prompt_length + g.max_turns * g.sampling_params.max_generate_length
    return min(n, int(c.trainer.algorithm.max_seq_len)) if c.trainer.algorithm.max_seq_len else n


def to_json_dict(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """A JSON-serializable dict of the resolved config (tuples become lists)."""
    return json.loads(c.to_json_best_effort())


def logprob_definitions(c: ml_collections.ConfigDict) -> dict[str, str]:
    """In words, which log-probabilities a run trains with (rl_config.json `_derived.logprobs`):
    `trainer` (π_θ and π_old: the trainer's forward), `engine` (μ: what the rollout engine returns
    for each sampled token, `generator.logprobs_mode`), `sampling` (what drew the tokens) and
    `ratio` (what the PPO ratio and TIS weight compare)."""
    sp, a, mode = c.generator.sampling_params, c.trainer.algorithm, c.generator.logprobs_mode
    filt = f", top-p {sp.top_p:g}, top-k {sp.top_k}" if (sp.top_p < 1 or sp.top_k > 0) else ""
    engine = {"full": f"log_softmax(logits / {sp.temperature:g}) over the full vocabulary",
              "sampled": f"log_softmax over the tokens top-p/top-k keep of logits / {sp.temperature:g} (the "
                         "distribution sampled)",
              "raw": "log_softmax(logits) at temperature 1 over the full vocabulary (vLLM's raw_logprobs, as the "
                     "seed runs' vLLM returned)"}.get(mode, mode)
    return {"trainer": f"log_softmax(logits / {a.temperature:g}) over the full vocabulary",
            "engine": engine, "sampling": f"temperature {sp.temperature:g}{filt}",
            "ratio": "PPO ratio pi_theta / pi_old (both the trainer's); TIS / off-policy weight pi_old / mu with "
                     "mu the engine's logprob above"}


def write_json_atomic(path: str, obj: Any) -> None:
    """Writes JSON to `path` atomically (temp file in the same directory, then rename)."""
    atomic_write_json(path, obj)


if __name__ == "__main__":  # python -m jaxrl.config show|diff ... (jaxrl/config_cli.py)
    import sys

    from jaxrl.config_cli import main as _cli_main

    sys.exit(_cli_main())
