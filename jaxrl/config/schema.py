"""The run-config schema: every key of `base_config()` declared once as a
:class:`~jaxrl.config.field.Field` (type and default, bounds or choices, a one-line meaning, its
source), in the order `rl_config.json` lists them. `trainer.algorithm` is declared in
jaxrl/config/algorithm.py, next to nothing else, because the objective's dataclasses are built from it;
`harbor.error_policy` is `jaxrl.train.error_policy.ErrorPolicy`'s fields (owner "error_policy").

`base_config()` (the ml_collections ConfigDict that recipes start from), `validate()`'s per-key
checks (`field_problems`), `python -m jaxrl.config show` (`KEY_DOCS`, `key_type`) and docs/config.md
(`jaxrl.config.docs`) are generated from `FIELDS`.
"""
from __future__ import annotations

from typing import Any

import ml_collections

from jaxrl.config.algorithm import ALGORITHM
from jaxrl.config.field import Field as F
from jaxrl.config.field import section_fields

FIELDS: tuple[F, ...] = (
    *section_fields('',
        F('seed', 0,
          'seed of every random choice (prompt order, sampling); same seed + config = same metrics',
          bounds=">= 0", fix="use 0 or another non-negative integer"),
        F('name', 'rloo',
          "run name: the default workdir is runs/<name>; the report's title"),
        F('scale', 'cpu',
          'size preset chosen by the config string (configs/x.py:qwen3_8b): cpu | qwen3_8b'),
    ),
    *section_fields('model',
        F('path', '',
          "HF checkpoint directory of the starting policy; '' = the embedded default policy"),
        F('compute_dtype', 'float32',
          'dtype of the forward pass and of the published rollout weights: float32 | bfloat16',
          choices=("float32", "bfloat16"), noun="dtype"),
        F('remat', 'none',
          'activation recomputation per layer: none | full | save_dots | save_attention | save_dots_attention',
          choices=("none", "full", "save_dots", "save_attention", "save_dots_attention"), noun="policy"),
        F('attention_impl', 'xla',
          'attention kernel: xla (blocked flash, any backend) | cudnn (NVIDIA GPU) | splash (TPU)',
          choices=("xla", "cudnn", "splash"), noun="implementation",
          fix="use 'xla' (any backend), 'cudnn' (NVIDIA GPU) or 'splash' (TPU)"),
        F('logprobs_chunk_size', 1024,
          'tokens per chunk of the chunked log-softmax (never builds [N, T, vocab])',
          bounds=">= 1", fix="use 1024"),
        F('logprobs_save_probs', False,
          'keep exp(logits - max), tokens x vocab in the compute dtype, for the backward pass (no logits recompute)'),
        F('preset', '',
          "Qwen3 size (e.g. '8B') that jaxrl.plan compiles when model.path is ''"),
    ),
    *section_fields('mesh',
        F('data', 1,
          'devices on the data-parallel mesh axis; -1 = all remaining devices',
          bounds=">= 1", also=(-1,), problem="{v} is not a size", fix="use a positive size or -1 (all remaining devices)"),
        F('fsdp', -1,
          'devices on the FSDP mesh axis (params and optimizer state sharded); -1 = all remaining',
          bounds=">= 1", also=(-1,), problem="{v} is not a size", fix="use a positive size or -1 (all remaining devices)"),
        F('tensor', 1,
          'devices on the tensor-parallel mesh axis (heads and MLP split); -1 = all remaining',
          bounds=">= 1", also=(-1,), problem="{v} is not a size", fix="use a positive size or -1 (all remaining devices)"),
    ),
    *section_fields('data',
        F('task', 'arithmetic',
          'training prompts: arithmetic | arithmetic_partial | calculator | dataset | harbor (terminal tasks)'),
        F('dataset_path', '',
          'JSONL/Parquet prompt file (docs/usage.md) or a Harbor task set (docs/terminal_tasks.md)'),
        F('verify_tasks', False,
          'Harbor runs: verifier sanity gate first (oracle 1, empty agent 0); failing tasks left out',
          fix="use True to gate Harbor tasks before training"),
        F('eval_task', '',
          "built-in task whose held-out split is evaluated; '' = the held-out split of data.task"),
        F('eval_dataset_path', '',
          "JSONL or Parquet file of held-out prompts, or a held-out Harbor task set; '' = none"),
        F('eval_fraction', 0.05,
          "data.task=dataset without eval_dataset_path: share of the file's distinct prompts held out",
          bounds="[0, 1)", fix="use e.g. 0.05 (5% of the training file's prompts held out), or 0 for none"),
        F('eval_split_seed', 0,
          'seed of the eval_fraction split (not `seed`: runs with other seeds share it)',
          bounds=">= 0", fix="use 0 or another non-negative integer"),
        F('num_eval_prompts', 200,
          'held-out prompts evaluated before, during and after training; 0 = no evaluation',
          bounds=">= 0", problem="must be >= 0", fix="use 0 to skip evaluation"),
        F('max_prompt_length', 128,
          'longest rendered prompt in tokens; a longer dataset prompt stops the run at start',
          bounds=">= 1", problem="must be >= 1", fix="use e.g. 512"),
    ),
    *section_fields('generator',
        F('backend', 'jax',
          'rollout engine: jax (built-in sidecar, CPU or GPU) | vllm (external vLLM sidecars)',
          choices=("jax", "vllm"), noun="backend"),
        F('sidecar_urls', (),
          'base URLs of running sidecars: required for vllm; for jax, used instead of spawning',
          item=str),
        F('num_sidecars', 1,
          'JAX sidecar processes the trainer spawns (backend=jax without sidecar_urls)',
          bounds=">= 1", problem="must be >= 1", fix="use 1 on a CPU"),
        F('token_file', '',
          "shared secret of the sidecars' weight-load endpoint; '' = workdir/.sidecar_token"),
        F('logprobs_mode', 'full',
          "engine logprobs: full (log softmax(logits/T)) | sampled (after top-p/k) | raw (at T 1, vLLM's default)"),
        F('gpu_memory_utilization', 0.3,
          'share (0-1) of each GPU a sidecar engine claims; no effect on CPU',
          bounds="(0, 1)", problem="{v} is not a fraction in (0, 1)", fix="use e.g. 0.6 for the trainer and 0.3 for a sidecar on the same GPUs"),
        F('colocate_with_trainer', False,
          "backend=vllm: the vLLM sidecars share the trainer's GPUs"),
        F('n_samples_per_prompt', 8,
          'samples per prompt: one group of n trajectories for the group advantages',
          bounds=">= 1", problem="must be >= 1", fix="use e.g. 8"),
        F('max_turns', 1,
          'assistant turns per trajectory (1 = single-turn; more for tools and multi-turn envs)',
          bounds=">= 1", problem="must be >= 1", fix="use 1 for single-turn tasks"),
        F('max_input_tokens', 0,
          "longest input (tokens) of one turn, the agent's context; 0 = only max_seq_len",
          bounds=">= 0", fix="use 0 (no limit besides max_seq_len) or e.g. 32000"),
        F('enable_thinking', False,
          'Qwen3 thinking mode of the chat template (False: empty <think></think> in the prompt)'),
        F('chat_template', '',
          "past turns' thinking when messages are rendered: '' = the checkpoint's template | keep_thinking",
          choices=("", "keep_thinking"),
          fix="use keep_thinking (past <think> blocks kept, as the seed runs' template) or '' (the checkpoint's chat template)"),
        F('execute_truncated_turns', False,
          'run the tool calls of a turn cut by max_generate_length (False: never)',
          fix="use False (a cut turn's tool calls never run) unless every tool is free of side effects"),
    ),
    *section_fields('generator.sampling_params',
        F('max_generate_length', 16,
          'new tokens per assistant turn',
          bounds=">= 1", problem="must be >= 1", fix="use e.g. 1024"),
        F('temperature', 1.0,
          'sampling temperature of training rollouts (= trainer.algorithm.temperature)'),
        F('top_p', 1.0,
          'nucleus mass of training rollouts, in (0, 1]; 1 = off',
          bounds="(0, 1]", problem="{v} must be in (0, 1]", fix="use 1.0"),
        F('top_k', -1,
          'top-k of training rollouts; -1 or 0 = off',
          bounds=">= 0", also=(-1,), problem="{v} is not a valid top-k",
          fix="use -1 (or 0) to disable top-k, or a positive k"),
    ),
    *section_fields('generator.eval_sampling_params',
        F('temperature', 1.0,
          'temperature of held-out evaluation when greedy is False'),
        F('greedy', True,
          'held-out evaluation decodes greedily (argmax)'),
        F('episodes_per_prompt', 1,
          'episodes per held-out prompt when not greedy',
          bounds=">= 1", problem="{v!r} is not a count",
          fix="use an integer >= 1 (episodes per held-out prompt)"),
    ),
    *section_fields('generator',
        F('episode_delay_s', 0.0,
          'benchmark/test knob: every episode takes at least this long (s); 0 = off',
          bounds=">= 0", problem="{v} is not a delay", fix="use 0 (off) or a number of seconds"),
        F('episode_delay_jitter', 0.0,
          'spread of episode_delay_s per prompt, in [0, 1]: d x (1 + jitter x (2u - 1))',
          bounds="[0, 1]",
          fix="use 0 (every episode takes episode_delay_s) up to 1 (uniform in [0, 2 x delay])"),
    ),
    *section_fields('harbor',
        F('prompt_style', 'terminus-2',
          "agent prompt: terminus-2 (Harbor's own texts, read at run time) | compact (embedded policy)"),
        F('harbor_wheel', '',
          "path of a harbor wheel holding terminus-2's texts; '' = the installed harbor package"),
        F('strict_json_parser', False,
          'strict Terminus-2 parsing: no auto-correction, responses with warnings run nothing',
          fix="use False (Harbor 0.26's parser) or True"),
        F('stop_agent_processes', False,
          "kill the agent's processes before the verifier runs (Harbor keeps them running)",
          fix="use False (Harbor: the agent's processes run through verification) or True"),
    ),
    *section_fields('harbor.error_policy',
        F('mask', (),
          'error classes left out of the loss and the baselines (outcome or Harbor names)',
          item=str, owner="error_policy"),
        F('passthrough', ('agent_timeout',),
          "error classes keeping the verifier's reward (e.g. agent_timeout)", owner="error_policy"),
        F('zero', (),
          'error classes trained on with reward 0',
          item=str, owner="error_policy"),
        F('default', 'zero',
          'treatment of error classes in no list: mask | passthrough | zero', owner="error_policy",
          choices=("mask", "passthrough", "zero"), noun="treatment"),
        F('no_retry', (),
          "error classes never retried (Harbor's exclude_exceptions)",
          item=str, owner="error_policy"),
        F('max_retries', 0,
          'times a failed trial is played again (0 = never)', owner="error_policy"),
        F('min_wait_sec', 1.0,
          'shortest wait before a retry (s)', owner="error_policy"),
        F('max_wait_sec', 60.0,
          'longest wait before a retry (s)', owner="error_policy"),
        F('wait_multiplier', 1.0,
          'retry wait = clip(wait_multiplier * 2**attempt, min, max) seconds', owner="error_policy"),
    ),
    *section_fields('harbor',
        F('agent_timeout_sec', 0.0,
          "agent's wall-clock budget per trial (s); 0 = the task's [agent] timeout_sec",
          bounds=">= 0", problem="{v!r} is not a duration", fix="use seconds > 0, or 0 for each task's own value from task.toml"),
        F('verifier_timeout_sec', 0.0,
          "verifier's wall-clock limit per trial (s); 0 = the task's [verifier] timeout_sec",
          bounds=">= 0", problem="{v!r} is not a duration", fix="use seconds > 0, or 0 for each task's own value from task.toml"),
        F('command_timeout_sec', 60.0,
          "cap in seconds on one command's wait (Terminus: 60)", source="Harbor's Terminus-2 agent",
          bounds="> 0", fix="use 60 (Terminus's cap on one command)"),
        F('max_output_bytes', 10000,
          'terminal output bytes per observation, head and tail kept (Terminus: 10000)',
          bounds=">= 64", problem="{v!r} is too small", fix="use 10000 (Terminus)"),
        F('concurrency', 0,
          'threads driving the trials of a step; 0 = one per trial, up to max(16, 8 x cores)',
          bounds=">= 0", fix="use 0 (one thread per trial, up to max(16, 8 x cores)) or a thread count"),
        F('keep_trial_logs', False,
          "keep each trial's logs/ and result.json under workdir/trials/"),
        F('environment_backend', 'profile',
          'task environments: profile (Dockerfile read on host profiles) | image (built) | auto',
          choices=("profile", "image", "auto"), noun="backend"),
        F('base_images', (),
          "image backend: 'FROM name=local image' entries mapping base images (nothing is pulled)",
          item=str),
        F('image_cache_max_mb', 20480,
          'image backend: MB of built task images kept (least recently used removed above it)',
          bounds="> 0", problem="{v!r} must be a positive integer", fix="use 20480 (20 GB) or the disk you can spare"),
        F('build_concurrency', 1,
          'image backend: image builds at once',
          bounds=">= 1", fix="use 1 on small machines"),
        F('image_builder', 'buildah',
          "image backend: the builder, 'buildah' or 'podman' (both run no container runtime)",
          choices=("buildah", "podman"), noun="builder"),
        F('image_cache_dir', '',
          "image backend: index, locks and build logs; '' = ~/.cache/jaxrl/images"),
        F('pip_mirror', '',
          "a folder of wheels (pip download -d DIR ...) pip and uv in trials install from; '' = none"),
        F('tool_mirror', '',
          "a folder whose bin/ (launch/make_tool_mirror.sh DIR --uv VER) ends the verifier's PATH; '' = none"),
    ),
    *section_fields('trainer',
        F('num_steps', 60,
          'RL steps (one rollout batch each); raise it and rerun to continue a finished run',
          bounds=">= 1", fix="use a positive integer"),
        F('train_batch_size', 64,
          'prompts per RL step, each sampled n_samples_per_prompt times',
          bounds=">= 1", fix="use a positive integer"),
        F('mini_batch_size', 64,
          'prompts per optimizer step; divides train_batch_size',
          bounds=">= 1", fix="use a positive integer"),
        F('micro_batch_size', 128,
          'sequences per micro-batch (gradient accumulation); divides mini_batch_size x n',
          bounds=">= 1", fix="use a positive integer"),
        F('update_epochs_per_batch', 1,
          "passes over the step's mini-batches (PPO epochs)",
          bounds=">= 1", fix="use a positive integer"),
        F('eval_interval', 10,
          'RL steps between held-out evaluations; 0 = only before training and at the end',
          bounds=">= 0", fix="use 0 to evaluate only at the ends"),
        F('eval_before_train', True,
          "evaluate the starting policy before step 1 (the report's 'start')"),
        F('ckpt_interval', 5,
          'RL steps between Orbax checkpoints',
          bounds=">= 1", fix="use e.g. 5"),
        F('max_ckpts_to_keep', 2,
          'latest checkpoints kept (the best-EMA checkpoint is kept in addition)',
          bounds=">= 1", fix="use e.g. 2"),
        F('weight_sync_keep', 2,
          'published policy versions kept in workdir/sync',
          bounds=">= 1", fix="use 2"),
        F('seq_len_buckets', (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
          'padded sequence lengths (tokens) of the train step; one compile per bucket used',
          bounds=">= 1", fix="use powers of two, e.g. (64, 128, 256, 512, 1024)"),
        F('ema_span', 5,
          'span of the reward EMA that picks the best checkpoint: alpha = 2 / (span + 1)',
          bounds=">= 1", fix="use 5"),
        F('save_on_new_best', True,
          'also checkpoint every step whose reward EMA is a new best'),
        F('export_best', True,
          'export the best-EMA checkpoint in HF format to workdir/best/ at the end'),
        F('success_threshold', 1.0,
          'a trajectory is a success when its reward >= this (success rates, pass@n, eval)',
          finite=True, fix="use the reward of a solved task, e.g. 1.0"),
        F('logprob_diff_warn_threshold', -1.0,
          'warn above this max |trainer - engine logprob|; 0 = never; -1 = by compute dtype',
          bounds=">= 0", also=(-1,), problem="{v} is not a bound",
          fix="use a bound >= 0 (0 never warns), or -1 for the compute dtype's default (1e-3 float32, 1.0 bfloat16)"),
        F('gpu_memory_fraction', 0.6,
          "share (0-1) of each GPU the trainer's JAX claims; no effect on CPU",
          bounds="(0, 1)", problem="{v} is not a fraction in (0, 1)", fix="use e.g. 0.6 for the trainer and 0.3 for a sidecar on the same GPUs"),
    ),
    *section_fields('trainer.optimizer',
        F('lr', 8e-06,
          'AdamW peak learning rate',
          bounds="> 0", problem="{v} must be a positive number",
          fix="use e.g. 8e-6 (the Qwen3-8B recipes) or 1e-4 (the CPU recipe's tiny policy)"),
        F('weight_decay', 0.0,
          'AdamW decoupled weight decay',
          bounds=">= 0", fix="use 0"),
        F('adam_betas', (0.9, 0.999),
          'AdamW (beta1, beta2)',
          bounds="[0, 1)", fix="use (0.9, 0.999)"),
        F('adam_eps', 1e-08,
          'AdamW epsilon',
          bounds="> 0", fix="use 1e-08"),
        F('max_grad_norm', 0.9,
          'global gradient-norm clip',
          bounds="> 0", fix="use e.g. 1.0"),
        F('scheduler', 'constant',
          'learning-rate schedule after the warm-up: constant | cosine',
          choices=("constant", "cosine"), noun="scheduler"),
        F('num_warmup_steps', 0,
          'optimizer steps of linear learning-rate warm-up',
          bounds=">= 0", fix="use 0"),
        F('offload', 'none',
          'optimizer state in pinned host memory: none | moments | moments_and_master',
          choices=("none", "moments", "moments_and_master"), noun="placement"),
    ),
    *ALGORITHM,
    *section_fields('trainer.critic.model',
        F('path', '',
          "HF Qwen3 checkpoint of the critic's trunk (gae only); '' = the policy's"),
    ),
    *section_fields('trainer.critic.optimizer',
        F('lr', 5e-06,
          'critic AdamW learning rate (betas, eps, schedule, offload: trainer.optimizer)',
          bounds="> 0", problem="{v} must be a positive number", fix="use e.g. 5e-6 (SkyRL's default)"),
        F('weight_decay', 0.0,
          'critic AdamW decoupled weight decay',
          bounds=">= 0", fix="use 0"),
        F('max_grad_norm', 1.0,
          'critic global gradient-norm clip',
          bounds="> 0", fix="use e.g. 1.0"),
    ),
    *section_fields('trainer.async_rl',
        F('mode', 'sync',
          'sync (generate, then train) | one_step (generator one batch ahead) | fully_async',
          choices=("sync", "one_step", "fully_async"), noun="mode",
          source="SkyRL's fully-async trainer (docs/async.md); jaxrl's one_step is the one-step-off-policy pipeline"),
        F('max_staleness_steps', 4,
          'fully_async: a group is trained only while its oldest token is <= this many versions old',
          bounds=">= 0", problem="{v!r} is not a step count >= 0",
          fix="use e.g. 4 (0 = every trained trajectory was sampled by the policy being trained)",
          source="SkyRL `fully_async.max_staleness_steps` under trainer (same name, same meaning)"),
        F('max_in_flight_trajectories', 0,
          'fully_async: trajectories generating at once; 0 = (staleness + 1) x B x n',
          bounds=">= 0", fix="use 0 (the capacity rule)"),
        F('stale_action', 'drop',
          'a group older than the bound is dropped and counted | regenerated',
          choices=("drop", "regenerate"), noun="action"),
    ),
    *section_fields('trainer.collapse',
        F('enabled', True,
          'detect a reward collapse: the EMA below its best by drop for patience steps'),
        F('drop', 0.2,
          'collapse: drop of the reward EMA below its best (absolute reward)',
          bounds="> 0", fix="use e.g. drop=0.2, patience=3"),
        F('patience', 3,
          'collapse: consecutive steps below best - drop',
          bounds=">= 1", fix="use e.g. drop=0.2, patience=3"),
        F('action', 'stop',
          'on a collapse: stop | rollback (to the best checkpoint, with a lower lr)',
          choices=("stop", "rollback"), noun="action"),
        F('lr_factor', 0.5,
          'rollback: new lr = lr x lr_factor',
          bounds="(0, 1]", fix="use e.g. 0.5"),
        F('max_rollbacks', 2,
          'rollbacks before a collapse stops the run',
          bounds=">= 0", problem="must be >= 0", fix="use 0 to never roll back"),
    ),
)
FIELDS_BY_KEY: dict[str, F] = {f.key: f for f in FIELDS}
assert len(FIELDS_BY_KEY) == len(FIELDS), "a config key is declared twice"

# One line per key: what it means, with units and allowed values (what `show` prints).
KEY_DOCS: dict[str, str] = {f.key: f.doc for f in FIELDS}


def base_config() -> ml_collections.ConfigDict:
    """The full schema with defaults for the CPU scale (embedded policy, arithmetic task): a fresh
    ConfigDict with every key of `FIELDS` (sections created in declaration order)."""
    c = ml_collections.ConfigDict()
    for f in FIELDS:
        node = c
        *parents, leaf = f.key.split(".")
        for p in parents:
            if p not in node:
                node[p] = ml_collections.ConfigDict()
            node = node[p]
        node[leaf] = f.default
    return c


def get_value(c, key: str) -> Any:
    """The value of the dotted `key` in the ConfigDict (or nested dict) `c`.
    Raises: KeyError when a part of the key is missing."""
    node = c
    for part in key.split("."):
        node = node[part]
    return node


def field_problems(c):
    """(key, problem, fix) of every key of `c` whose value violates its Field (type, bounds,
    choices), in declaration order; keys `c` lacks are skipped (an old rl_config.json)."""
    out = []
    for f in FIELDS:
        try:
            v = get_value(c, f.key)
        except (KeyError, AttributeError):
            continue
        problem = f.problem_with(v)
        if problem:
            if f.owner and f.attr != f.leaf:
                problem += f" ({'LossConfig' if f.owner == 'loss' else 'AdvantageConfig'}.{f.attr})"
            out.append((f.key, problem, f.fix_text()))
    return out


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
    """The type of a config value as `show` prints it: int, float, str, bool, tuple[int], ...
    (an empty tuple: its Field's element type)."""
    if isinstance(value, (tuple, list)):
        items = {type(v).__name__ for v in value}
        f = FIELDS_BY_KEY.get(key)
        if not items and f is not None:
            return f.type_name
        return f"tuple[{' | '.join(sorted(items))}]" if items else "tuple"
    return "None" if value is None else type(value).__name__
