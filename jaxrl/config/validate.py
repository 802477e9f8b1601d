"""`validate(config)`: every check of a run config before any work starts, each raising the
one-line `ConfigError` naming the key and the fix.

The checks of one key against its declaration (type, bounds, choices) are generic: `field_problems`
(schema.py) runs them for every Field. What is left here needs more than one key, the registries
(estimator, loss and reduction names, tasks), the file system or the device count: the cross-key
checks, each in one named function (`_check_batches`, `_check_generation`, `_check_async`, ...).
"""
from __future__ import annotations

import math
import os

import ml_collections

from jaxrl.config.derived import advantage_config, loss_config, needs_critic, rollout_max_seq_len
from jaxrl.config.harbor_checks import _is_harbor_run, check_harbor
from jaxrl.config.schema import FIELDS_BY_KEY, field_problems
from jaxrl.errors import ConfigError
from jaxrl.fileio import HF_CHECKPOINT_HINT, hf_checkpoint_problem, tokenizer_problem


def _require(cond: bool, key: str, problem: str, fix: str):
    """Raises `ConfigError(key, problem, fix)` unless `cond`."""
    if not cond:
        raise ConfigError(key, problem, fix)


def _check_fields(c: ml_collections.ConfigDict) -> None:
    """Every key against its declaration (schema.py: type, bounds, choices); the first violation."""
    for key, problem, fix in field_problems(c):
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
    bad path is then reported in about a second, not after 17-31 s of imports): every key against
    its Field (type, bounds, choices), the
    model checkpoint (`model.path`), a dataset file (`data.task=dataset`) and a held-out file.
    Raises: ConfigError, with the message `validate` gives for the same problem."""
    _check_fields(c)
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

    The order: every key against its Field (`field_problems`), the external inputs, then the
    cross-key checks below, each a named function.

    Raises:
      ConfigError: naming the first offending key, the problem and the fix.
    """
    _check_fields(c)
    if check_inputs:
        _check_model_input(c)
    _check_registry_names(c)
    _check_algorithm(c)
    if c.trainer.critic.model.path and check_inputs and needs_critic(c):
        problem = hf_checkpoint_problem(c.trainer.critic.model.path)
        _require(problem is None, "trainer.critic.model.path", problem,
                 f"point it at a Qwen3 checkpoint, {HF_CHECKPOINT_HINT}, or use '' for the policy's")
    _check_batches(c)
    _check_generation(c, check_inputs)
    _check_async(c)
    from jaxrl import gpu_memory

    if platform == "gpu":  # the shares' ranges are their Fields' (checked above)
        gpu_memory.check_shares(c)
    need = rollout_max_seq_len(c)
    t = c.trainer
    _require(len(t.seq_len_buckets) > 0 and max(t.seq_len_buckets) >= need, "trainer.seq_len_buckets",
             f"the largest bucket {max(t.seq_len_buckets, default=0)} is shorter than the longest possible "
             f"trajectory ({need} tokens = data.max_prompt_length + generator.max_turns x max_generate_length, "
             "capped by trainer.algorithm.max_seq_len)", f"add a bucket >= {need}")
    check_harbor(c, check_inputs)
    _check_data(c, check_inputs)
    _check_mesh(c, num_devices)


def _check_registry_names(c: ml_collections.ConfigDict) -> None:
    """Names looked up in a registry that can grow (`jaxrl.rl.register_*`, `jaxrl.envs`,
    `jaxrl.rollout.types.LOGPROBS_MODES`), so they are not fixed choices of a Field."""
    from jaxrl.envs import TASK_REGISTRY
    from jaxrl.rl import registry as rl_registry  # names of estimators, losses, reductions
    from jaxrl.rollout.types import LOGPROBS_MODES

    a = c.trainer.algorithm
    for key, value, names in (
        ("trainer.algorithm.advantage_estimator", a.advantage_estimator, rl_registry.ADVANTAGE_ESTIMATORS),
        ("trainer.algorithm.policy_loss_type", a.policy_loss_type, rl_registry.POLICY_LOSSES),
        ("trainer.algorithm.loss_reduction", a.loss_reduction, rl_registry.LOSS_REDUCTIONS),
    ):
        _require(value in names, key, f"unknown name {value!r}", f"use one of {sorted(names)}")
    g = c.generator
    _require(g.logprobs_mode in LOGPROBS_MODES, "generator.logprobs_mode", f"unknown mode {g.logprobs_mode!r}",
             "use 'full' (log softmax(logits / T) over the vocabulary, the trainer's definition) or 'sampled' "
             "(the distribution actually sampled, after top-p/top-k)")
    for key in ("data.task", "data.eval_task"):
        name = c.data.task if key == "data.task" else c.data.eval_task
        if name and not (key == "data.task" and name in ("dataset", "harbor")):
            _require(name in TASK_REGISTRY, key, f"unknown task {name!r}",
                     f"use one of {sorted(TASK_REGISTRY)}" + (", 'dataset' or 'harbor'" if key == "data.task" else ""))


def _check_algorithm(c: ml_collections.ConfigDict) -> None:
    """The cross-key checks of trainer.algorithm, then LossConfig / AdvantageConfig built from it
    (their own cross-field checks; errors mapped to the key)."""
    a, pre = c.trainer.algorithm, "trainer.algorithm."
    opc = a.off_policy_correction
    if a.loss_reduction.startswith("seq_mean_token_sum_norm"):
        _require(a.max_seq_len and a.max_seq_len > 0, "trainer.algorithm.max_seq_len",
                 "seq_mean_token_sum_norm needs an explicit constant max_seq_len (it is never the padded width)",
                 "set --config.trainer.algorithm.max_seq_len to the total token budget per sequence, e.g. 32768")
    if a.use_kl_in_reward:
        _require(not a.use_kl_loss, pre + "use_kl_in_reward", "the KL penalty is either in the reward or in the loss "
                 "(use_kl_loss=True, the default)", "also pass --config.trainer.algorithm.use_kl_loss=False")
        _require(a.kl_loss_coef > 0, pre + "kl_loss_coef", "use_kl_in_reward takes its initial beta from kl_loss_coef, "
                 "which is 0", "set it to the penalty coefficient, e.g. 0.05")
    _require((opc.token_mask_is_threshold_low > 0) == (opc.token_mask_is_threshold_high > 0),
             pre + "off_policy_correction.token_mask_is_threshold_low", "the token mask needs both bounds",
             "set token_mask_is_threshold_low and token_mask_is_threshold_high together (or both to 0)")
    n, est = c.generator.n_samples_per_prompt, a.advantage_estimator
    min_size = {"rloo": 2, "rloo_n": a.group_advantage_min_size}.get(est)  # groups smaller get advantage 0
    _require(min_size is None or n >= min_size, "generator.n_samples_per_prompt",
             f"{n} sample(s) per prompt with advantage_estimator={est!r}, which gives advantage 0 to every "
             f"member of a group smaller than {min_size}: no step would train",
             f"use n_samples_per_prompt >= {min_size}, or an estimator with a baseline of its own (e.g. "
             "--config.trainer.algorithm.advantage_estimator=reinforce_pp)")
    loss_config(c)
    advantage_config(c)


def _check_batches(c: ml_collections.ConfigDict) -> None:
    """Batch sizes divide one another (SkyRL semantics: train/mini in prompts, micro in sequences)."""
    t, g = c.trainer, c.generator
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


def _check_generation(c: ml_collections.ConfigDict, check_inputs: bool) -> None:
    """Sampling temperatures (the engine's bound; the trainer's equals the rollouts'), vLLM's
    sidecar URLs and the logprob definition the backend can deliver."""
    from jaxrl.rollout.types import MIN_TEMPERATURE  # the engine's bound (float32 logits / temperature)

    g, a = c.generator, c.trainer.algorithm
    sp = g.sampling_params
    for key, temp, argmax in (
            ("generator.sampling_params.temperature", sp.temperature,
             "RL trains on samples of the policy; argmax rollouts have no gradient signal"),
            ("generator.eval_sampling_params.temperature", g.eval_sampling_params.temperature,
             "for argmax decoding set generator.eval_sampling_params.greedy=True")):
        _require(MIN_TEMPERATURE <= temp < math.inf, key, f"{temp} must be finite and >= {MIN_TEMPERATURE}",
                 f"use 1.0 ({argmax})")
    _require(a.temperature == g.sampling_params.temperature or a.allow_temperature_mismatch,
             "trainer.algorithm.temperature",
             f"{a.temperature} differs from generator.sampling_params.temperature={g.sampling_params.temperature}: "
             "the trainer's logprobs would describe another distribution than the one the rollouts were sampled "
             "from (every importance ratio is off)",
             "set both to the same value, or pass --config.trainer.algorithm.allow_temperature_mismatch=True "
             "to train against a different temperature on purpose")
    if g.backend == "vllm" and check_inputs:
        _require(len(g.sidecar_urls) > 0, "generator.sidecar_urls", "backend=vllm needs the URLs of running sidecars",
                 "start them with launch/vllm_sidecar.sh and pass --config.generator.sidecar_urls")
    _check_logprobs_mode(c)


def _check_data(c: ml_collections.ConfigDict, check_inputs: bool) -> None:
    """The prompt files exist, and the data keys set agree with data.task."""
    if c.data.task in ("dataset", "harbor") and check_inputs:
        from jaxrl.envs.harbor.dataset import spec_exists

        _require(bool(c.data.dataset_path) and spec_exists(c.data.dataset_path), "data.dataset_path",
                 f"{c.data.dataset_path!r} does not exist",
                 "point it at a .jsonl or .parquet prompt file" if c.data.task == "dataset" else
                 "point it at a Harbor task directory, a folder of tasks, a DCAgent .parquet, or use "
                 "family:<name>:<first>-<last>")
    _require(not (c.data.eval_dataset_path and c.data.eval_task), "data.eval_dataset_path",
             f"both data.eval_dataset_path={c.data.eval_dataset_path!r} and data.eval_task={c.data.eval_task!r} "
             "are set", "keep one held-out set: drop data.eval_task or data.eval_dataset_path")
    if c.data.eval_dataset_path and check_inputs and not _is_harbor_run(c):
        _require(os.path.isfile(c.data.eval_dataset_path), "data.eval_dataset_path",
                 f"{c.data.eval_dataset_path!r} does not exist", "point it at a .jsonl or .parquet prompt file")
    _require(c.data.task in ("dataset", "harbor") or not c.data.dataset_path, "data.dataset_path",
             f"{c.data.dataset_path!r} is set but data.task={c.data.task!r} does not read it (it trains on the "
             "built-in task)", "add --config.data.task=dataset to train on the file, or drop data.dataset_path")


def _check_mesh(c: ml_collections.ConfigDict, num_devices) -> None:
    """At most one mesh axis is -1, and the mesh fits `num_devices` (when given) with micro-batches
    that split over data x fsdp."""
    t, g = c.trainer, c.generator
    axes = [int(c.mesh.data), int(c.mesh.fsdp), int(c.mesh.tensor)]
    _require(axes.count(-1) <= 1, "mesh", "at most one axis may be -1", "set the other axes explicitly")
    if num_devices is None:
        return
    known = math.prod(v for v in axes if v != -1)
    if num_devices % known == 0:
        sizes = [num_devices // known if v == -1 else v for v in axes]
        rows_axis = sizes[0] * sizes[1]
        _require(t.micro_batch_size % rows_axis == 0, "trainer.micro_batch_size",
                 f"{t.micro_batch_size} sequences do not split over data x fsdp = {rows_axis} devices",
                 f"use a multiple of {rows_axis} that divides {t.mini_batch_size * g.n_samples_per_prompt}")
    if not (num_devices % known == 0 and (-1 in axes or known == num_devices)):
        from jaxrl.parallel import mesh_hint

        shape = " x ".join(f"{n}={v}" for n, v in zip(("data", "fsdp", "tensor"), axes))
        raise ConfigError("mesh", f"mesh {shape} does not fit the {num_devices} available devices",
                          mesh_hint(*axes, num_devices))


ASYNC_MODES = FIELDS_BY_KEY["trainer.async_rl.mode"].choices  # ("sync", "one_step", "fully_async")


def _check_async(c: ml_collections.ConfigDict) -> None:
    """An asynchronous run trains one optimizer step per RL step, within its in-flight bound, with a
    rollout-anchored loss when its trajectories can be stale (`jaxrl.rl.loss_config.is_rollout_anchored`)."""
    from jaxrl.rl import loss_config as rl_loss_config

    t, ac, g = c.trainer, c.trainer.async_rl, c.generator
    n, B = g.n_samples_per_prompt, t.train_batch_size
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


def _check_logprobs_mode(c: ml_collections.ConfigDict) -> None:
    """generator.logprobs_mode is a definition the run's backend can deliver at the
    run's sampling settings (training, and evaluation unless it is greedy)."""
    from jaxrl.rollout import logprob_modes

    g, sp, es = c.generator, c.generator.sampling_params, c.generator.eval_sampling_params
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
