"""Evaluate a checkpoint on a recipe's held-out set with the JAX engine.

  python -m jaxrl.evaluate --model runs/rloo/best            # the run's own held-out set (best/rl_config.json)
  python -m jaxrl.evaluate --model runs/rloo/sync/61          # a published policy version
  python -m jaxrl.evaluate --model runs/rloo/checkpoints/60   # any training checkpoint the run kept
  python -m jaxrl.evaluate --model jaxrl/assets/default_policy --config=configs/rloo.py   # the starting model
  python -m jaxrl.evaluate --model runs/rloo/best --config=configs/rloo.py --config.data.num_eval_prompts=500

The held-out set, its decoding and the success rule are the trainer's (jaxrl/train/evaluation.py):
the recipe's held-out prompts (`data.eval_dataset_path`, `data.eval_task`, the task's eval split or
the `data.eval_fraction` share of a dataset), each generated once with
`generator.eval_sampling_params` (greedy by default) under the training rollout limits and engine
settings, a success when its reward >= `trainer.success_threshold`. So the number for a run's
best/ equals the "best-EMA checkpoint" number of its report.md, and the starting model's equals
the report's "start". Without --config, the run config next to --model is used (best/rl_config.json,
or WORKDIR/rl_config.json for WORKDIR/sync/<version> and WORKDIR/checkpoints/<step>); --config.KEY=VALUE overrides apply to it
(python -m jaxrl.evaluate --model runs/rloo/best --config.data.num_eval_prompts=1000).

Prints the held-out success on stdout; --output writes it with every prompt, answer and reward as
JSON. Exit status 2 (one line) for a model or config that cannot be used.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from absl import flags
from ml_collections import config_flags

from jaxrl import cli

# The command's flags are registered by its entry point only (define_flags), so that several
# jaxrl commands (main, plan, evaluate, chat) can be imported into one process without absl's
# DuplicateFlagError on their shared names (--config, --model).
_CONFIG = None
_MODEL = None
_OUTPUT = None
# --config.KEY=VALUE overrides given without --config: applied to the run config next to --model.
_RUN_CONFIG_OVERRIDES: list[str] = []


def define_flags() -> None:
    """Registers this command's absl flags (called once, by `python -m` of this module)."""
    global _CONFIG, _MODEL, _OUTPUT
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe whose held-out set to use, e.g. "
                                              "configs/rloo.py[:scale] (default: the run config next to --model).",
                                              lock_config=True)
    _MODEL = flags.DEFINE_string("model", None, "Policy: an HF checkpoint directory (a run's best/, the starting model) "
                                 "a published version WORKDIR/sync/<version> or a training checkpoint "
                                 "WORKDIR/checkpoints/<step>.")
    _OUTPUT = flags.DEFINE_string("output", None, "Also write the result, with every prompt's answer and reward, to "
                                  "this JSON file.")


def evaluate_policy(model: str, c, config_source: str = "") -> dict[str, Any]:
    """Evaluates the policy at `model` on the held-out set of run config `c`.

    Args:
      model: an HF checkpoint, a published version or a training checkpoint directory (`jaxrl.policy`).
      c: the run config (a ConfigDict such as `base_config()` or a run's rl_config.json).
      config_source: where `c` came from, for the result's description.
    Returns:
      {"success_rate", "avg_reward", "num_prompts", "num_successes", "heldout" (what was
      evaluated), "model", "config", "seconds", "results": [{"task_id", "prompt", "response",
      "reward", "stop_reason"}, ...]}.
    Raises:
      policy.PolicyError: unusable model or config, or a config without a held-out set;
      DatasetError: a dataset file cannot be read.
    """
    from jaxrl import config as config_lib
    from jaxrl import policy
    from jaxrl.envs import run_rollouts
    from jaxrl.train import evaluation
    from jaxrl.train.prompts import PromptSource

    try:
        config_lib.validate(c, check_inputs=False)
    except config_lib.ConfigError as e:
        raise policy.PolicyError(f"{config_source or 'the run config'}: {e}") from None
    source = PromptSource(c, load_train=False)
    tasks = source.eval_batch()
    if not tasks:
        why = "data.num_eval_prompts is 0" if c.data.num_eval_prompts == 0 else "it has no held-out set"
        raise policy.PolicyError(f"nothing to evaluate: {why} ({config_source or 'run config'}). Fix: pass "
                                 "--config=<recipe> with a held-out set (data.eval_dataset_path, data.eval_fraction "
                                 "or data.eval_task) and data.num_eval_prompts > 0")
    t0 = time.perf_counter()
    sampler, tokenizer_dir, what = policy.load_engine(model, c, max_seq_len=config_lib.rollout_max_seq_len(c),
                                                      max_batch_rows=evaluation.engine_batch_rows(c))
    chat = policy.training_chat_template(tokenizer_dir, c.generator.enable_thinking, c.generator.chat_template)
    make_env, rollout_cfg, trials_root = None, evaluation.rollout_config, None
    if source.harbor is not None:  # Harbor terminal tasks: each a sandboxed trial (trial dirs in a temp folder)
        import dataclasses
        import tempfile

        trials_root = tempfile.mkdtemp(prefix="jaxrl-eval-")
        make_env = source.harbor.make_env_factory(trials_root)
        rollout_cfg = lambda c, n: dataclasses.replace(  # noqa: E731
            evaluation.rollout_config(c, n), env_workers=source.harbor.concurrency(len(tasks) * n))
    try:
        result, trajs = evaluation.evaluate(
            c, tasks, lambda t, sampling, n: run_rollouts(sampler, chat, t, sampling, rollout_cfg(c, n),
                                                          make_env=make_env))
    finally:
        if trials_root is not None:  # the trials' files were never shown; the folder was left behind
            import shutil

            shutil.rmtree(trials_root, ignore_errors=True)
    rate = result["eval/success_rate"]
    from jaxrl.train.batching import is_excluded

    scored = [t for t in trajs if not is_excluded(t)]  # an env_error / invalid_output is not scored (evaluation.score)
    return {
        "success_rate": rate, "success_rate_stderr": result["eval/success_rate_stderr"],
        "avg_reward": result["eval/avg_reward"], "num_prompts": len(scored), "num_excluded": len(trajs) - len(scored),
        "num_successes": sum(t.reward >= c.trainer.success_threshold for t in scored),
        "heldout": evaluation.describe(c, source),
        "model": what, "config": config_source, "seconds": time.perf_counter() - t0,
        "results": [{"task_id": task.task_id, "prompt": chat.tokenizer.decode(list(t.prompt_ids)),
                     "response": chat.tokenizer.decode(list(t.response_ids)), "reward": float(t.reward),
                     "stop_reason": t.stop_reason} for task, t in zip(tasks, trajs)],
    }


def main(argv):
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if not _MODEL.value:
        cli.usage_error("--model is required, e.g. --model=runs/rloo/best")
    from jaxrl import policy
    from jaxrl.config import ConfigError, write_json_atomic
    from jaxrl.envs import DatasetError
    from jaxrl.fileio import output_file_problem

    model = _MODEL.value
    problem = _OUTPUT.value and output_file_problem(_OUTPUT.value)
    if problem:  # before the evaluation, not after it
        print(f"error: --output: {problem}. Fix: pass a JSON file path in a writable folder", file=sys.stderr)
        sys.exit(2)
    if _CONFIG.value is not None:
        try:
            _CONFIG.value.name  # noqa: B018 - ml_collections loads the recipe file on first access (OSError if missing)
        except OSError as e:
            cli.recipe_load_error(e)
    try:
        policy.check_policy_dir(model)
        if _CONFIG.value is not None:
            c, source = _CONFIG.value, cli.recipe_spec(sys.argv[1:]) or "--config"
        else:
            path = policy.find_run_config(model)
            if path is None:
                raise policy.PolicyError(f"no rl_config.json next to --model {model!r}. Fix: pass "
                                         "--config=<recipe> (e.g. configs/rloo.py) to choose the held-out set")
            c, source = policy.read_run_config(path), path
            if _RUN_CONFIG_OVERRIDES:
                c = cli.apply_overrides(c, _RUN_CONFIG_OVERRIDES, path)
                source = f"{path} with {' '.join(_RUN_CONFIG_OVERRIDES)}"
        r = evaluate_policy(model, c, source)
    except (policy.PolicyError, DatasetError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a file of the model or the held-out set that cannot be read
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    print(f"jaxrl evaluate: {r['model']} on the held-out set of {source}: {r['heldout']}")
    excluded = f", {r['num_excluded']} excluded (env_error / invalid_output)" if r["num_excluded"] else ""
    print(f"held-out success: {100 * r['success_rate']:.1f}% ± {100 * r['success_rate_stderr']:.1f}% "
          f"({r['num_successes']} of {r['num_prompts']}{excluded}); "
          f"mean reward {r['avg_reward']:.3f}; {r['seconds']:.1f} s", flush=True)
    if _OUTPUT.value:
        try:
            write_json_atomic(_OUTPUT.value, r)  # atomic: a full disk leaves no partial file
        except OSError as e:
            from jaxrl import fileio

            path = fileio.disk_full_path(e, os.path.dirname(os.path.abspath(_OUTPUT.value)))
            if path is None:
                raise
            print("error: " + fileio.disk_full_message(path, os.path.dirname(os.path.abspath(_OUTPUT.value)),
                                                       "rerun the same command", e), file=sys.stderr)
            sys.exit(1)
        print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    define_flags()
    if cli.recipe_spec(sys.argv[1:]) is None:  # no recipe: the overrides apply to the run config next to --model
        sys.argv[1:], _RUN_CONFIG_OVERRIDES = cli.take_overrides(sys.argv[1:])
    cli.run(main, __doc__)
