"""Opening what a run produced for `jaxrl.evaluate` and `jaxrl.chat`: a policy checkpoint and the
run config it was trained under.

A policy is one of
* an HF-format checkpoint directory (config.json + safetensors + tokenizer): a run's exported
  `best/`, the starting model, any Qwen3 checkpoint;
* a published policy version, `WORKDIR/sync/<version>/` (Orbax shards in the engine's dtype): the
  weights are read onto the run's starting model (`model.path`, or the embedded default policy),
  whose tokenizer it uses;
* a training checkpoint, `WORKDIR/checkpoints/<step>/` (the Orbax state the trainer resumes from;
  its policy params are read in the dtype they were trained in, onto the starting model the same
  way): any step the run kept, not only the exported best.

The run config is the run's `rl_config.json`: `best/rl_config.json` (the export carries it), or
`WORKDIR/rl_config.json` for a published version or a training checkpoint; `--config` /
`--run_config` name another.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import ml_collections


class PolicyError(ValueError):
    """A policy directory or run config that cannot be used; the one-line message names it and the fix."""


def is_sync_version(path: str) -> bool:
    """True for a committed published policy version directory (`WORKDIR/sync/<version>/`)."""
    from jaxrl.rollout.weight_sync import SYNC_FILE

    return os.path.basename(os.path.normpath(path)).isdigit() and os.path.isfile(os.path.join(path, SYNC_FILE))


MODEL_FIX = ("pass {hint} such as a run's best/ or the starting model, a published version "
             "WORKDIR/sync/<version>, or a training checkpoint WORKDIR/checkpoints/<step>")


def is_training_checkpoint(path: str) -> bool:
    """True for a committed training checkpoint, `WORKDIR/checkpoints/<step>/` holding its
    `params/` (Orbax commits a step by renaming its temporary directory to the step number)."""
    path = os.path.abspath(path)
    return (os.path.basename(path).isdigit() and os.path.basename(os.path.dirname(path)) == "checkpoints"
            and os.path.isdir(os.path.join(path, "params")))


def read_checkpoint_params(path: str) -> dict:
    """The policy params of training checkpoint `path` (`is_training_checkpoint`): the trainer's
    stacked tree (`jaxrl.models.qwen3`), on the default device, in the dtype they were saved in.

    Raises:
      PolicyError: the params cannot be read (names the path and the cause).
    """
    import logging

    import jax
    import orbax.checkpoint as ocp

    from jaxrl.fileio import read_error_text
    from jaxrl.train.checkpoint import quiet_read, verify_checksums

    item = os.path.join(os.path.abspath(path), "params")
    absl_log = logging.getLogger("absl")
    level = absl_log.level
    absl_log.setLevel(logging.ERROR)  # Orbax warns that a bare item has no step metadata file
    try:
        with quiet_read(item), ocp.StandardCheckpointer() as ckptr:
            meta = ckptr.metadata(item).item_metadata
            if meta is None:
                raise ValueError("its Orbax metadata cannot be read (params/_METADATA, _sharding or "
                                 "manifest.ocdbt is damaged or missing)")
            one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one),
                                    meta.tree, is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))
            params = ckptr.restore(item, abstract)
        verify_checksums(int(os.path.basename(os.path.abspath(path))), "params", params, _saved_checksums(path))
        return params
    except Exception as e:  # noqa: BLE001 - any failure to read is reported as one line
        raise PolicyError(f"--model {path!r}: the training checkpoint's params cannot be read "
                          f"({read_error_text(e)}). Fix: pass another step of WORKDIR/checkpoints, the run's best/ "
                          "or a published version WORKDIR/sync/<version>") from e
    finally:
        absl_log.setLevel(level)


def _saved_checksums(path: str) -> Optional[dict]:
    """The checksums saved with training checkpoint `path` (its trainer_state JSON), or None: written
    before checksums were, or the trainer state cannot be read (the params are then checked for NaN/inf)."""
    from jaxrl.train.checkpoint import CHECKSUMS_KEY

    try:
        with open(os.path.join(path, "trainer_state", "metadata")) as f:
            saved = json.load(f).get(CHECKSUMS_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return saved if isinstance(saved, dict) else None


def check_model_path(model: str) -> None:
    """Rejects a `--model` path that does not exist or is a file (checked first, so that the
    message says so rather than that no run config was found next to it).

    Raises:
      PolicyError: one line naming the path, the problem and what a valid --model is.
    """
    from jaxrl.fileio import HF_CHECKPOINT_HINT

    if not os.path.exists(model):
        raise PolicyError(f"--model {model!r} does not exist{_run_hint(model)}. Fix: "
                          f"{MODEL_FIX.format(hint=HF_CHECKPOINT_HINT)}")
    if not os.path.isdir(model):
        raise PolicyError(f"--model {model!r} is a file, not a directory. Fix: "
                          f"{MODEL_FIX.format(hint=HF_CHECKPOINT_HINT)}")


def check_policy_dir(model: str) -> None:
    """Rejects a `--model` that is not a policy `load_engine` can open: missing, a file, or a
    directory that is neither an HF checkpoint nor a published version. Called before the run
    config is looked up, so that the message is about the directory itself.

    Raises:
      PolicyError: one line naming the path, what it is (a run directory, a training checkpoint)
        and what a valid --model is.
    """
    from jaxrl.fileio import HF_CHECKPOINT_HINT, hf_checkpoint_problem

    check_model_path(model)
    if is_sync_version(model) or is_training_checkpoint(model):
        return
    problem = hf_checkpoint_problem(model)
    if not problem:
        return
    if os.path.isfile(os.path.join(model, "config.json")):  # an HF checkpoint with a damaged or missing file
        raise PolicyError(f"--model: {problem}. Fix: restore the checkpoint's files (copy or export it again), or "
                          f"{MODEL_FIX.format(hint='another checkpoint')}")
    raise PolicyError(f"--model: {problem}, and it is not a published policy version (no sync.json)"
                      f"{_run_hint(model)}. Fix: {MODEL_FIX.format(hint=HF_CHECKPOINT_HINT)}")


def _kept(directory: str, kind: str) -> str:
    """The steps (kind "checkpoints") or versions ("sync") a run directory holds, as a short list."""
    is_entry = is_training_checkpoint if kind == "checkpoints" else is_sync_version
    try:
        found = sorted(int(n) for n in os.listdir(directory) if n.isdigit() and is_entry(os.path.join(directory, n)))
    except OSError:
        found = []
    if not found:
        return f"{directory} holds none"
    shown = ", ".join(map(str, found[:12])) + (", ..." if len(found) > 12 else "")
    return f"{'steps' if kind == 'checkpoints' else 'versions'} on disk: {shown}"


def _run_hint(model: str) -> str:
    """A parenthesised hint when `model` is, or names something inside, a run directory: what it
    is (the run itself, its checkpoints/ or sync/ folder, a checkpoint set aside as damaged, an
    unfinished write) and which steps or versions the run holds; "" otherwise."""
    path = os.path.abspath(model)
    name, parent = os.path.basename(path), os.path.dirname(path)
    if os.path.isfile(os.path.join(path, "rl_config.json")) and not os.path.isfile(os.path.join(path, "config.json")):
        return " (a run directory: use its best/, sync/<version> or checkpoints/<step>)"
    for kind in ("checkpoints", "sync"):
        if name == kind and os.path.isdir(path):
            return f" (a run's {kind}/ folder: pass one of its entries; {_kept(path, kind)})"
        if os.path.basename(parent) == kind and os.path.isdir(parent):
            if ".orbax-checkpoint-tmp" in name:
                return f" (an unfinished checkpoint write, never committed; {_kept(parent, kind)})"
            if name.isdigit():
                what = "a training checkpoint" if kind == "checkpoints" else "a published version"
                state = "does not exist" if not os.path.exists(path) else (
                    "has no params/: not a committed jaxrl checkpoint" if kind == "checkpoints" else "has no sync.json")
                return f" ({what} {name} that {state}; {_kept(parent, kind)})"
    if os.path.basename(parent) == "checkpoints_damaged":
        kept = os.path.join(os.path.dirname(parent), "checkpoints")
        return (f" (a checkpoint the trainer set aside as damaged when it resumed; {_kept(kept, 'checkpoints')} in "
                f"{kept})")
    return ""


def find_run_config(model: str) -> Optional[str]:
    """The `rl_config.json` that belongs to the policy at `model`, or None: `model/rl_config.json`
    (an exported best/), or the workdir's for a published version (`WORKDIR/sync/<v>`) or a
    training checkpoint (`WORKDIR/checkpoints/<step>`)."""
    own = os.path.join(model, "rl_config.json")
    if os.path.isfile(own):
        return own
    if is_sync_version(model) or is_training_checkpoint(model):
        workdir = os.path.dirname(os.path.dirname(os.path.abspath(model)))
        path = os.path.join(workdir, "rl_config.json")
        return path if os.path.isfile(path) else None
    return None


def _merge(dst: ml_collections.ConfigDict, src: dict, where: str, unknown: list) -> None:
    for k, v in src.items():
        if k not in dst:
            unknown.append(f"{where}{k}")
        elif isinstance(dst[k], ml_collections.ConfigDict):
            if isinstance(v, dict):
                _merge(dst[k], v, f"{where}{k}.", unknown)
            else:
                unknown.append(f"{where}{k}")
        else:
            dst[k] = tuple(v) if isinstance(v, list) else v


def read_run_config(path: str) -> ml_collections.ConfigDict:
    """A run's `rl_config.json` as a ConfigDict on top of `base_config()` (keys added to jaxrl
    since the run take their defaults).

    Raises:
      PolicyError: unreadable or not a JSON object, or keys this jaxrl does not know (the file
        comes from another version; the message lists them).
    """
    from jaxrl.config import base_config

    try:
        with open(path) as f:
            obj = json.load(f)
    except FileNotFoundError:
        raise PolicyError(f"{path}: the run config does not exist. Fix: pass the run's rl_config.json "
                          "(WORKDIR/rl_config.json or best/rl_config.json)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyError(f"{path}: cannot read the run config ({e}). Fix: pass the run's rl_config.json") from None
    if not isinstance(obj, dict):
        raise PolicyError(f"{path}: the run config is not a JSON object. Fix: pass the run's rl_config.json")
    obj.pop("_derived", None)  # notes written next to the config (rl_config.json), not keys
    c = base_config()
    unknown: list[str] = []
    try:
        _merge(c, obj, "", unknown)
    except (TypeError, ValueError) as e:  # ml_collections refuses a value of another type
        raise PolicyError(f"{path}: {e}. Fix: pass an rl_config.json written by this jaxrl version") from None
    if unknown:
        raise PolicyError(f"{path}: keys this jaxrl does not know: {', '.join(unknown[:8])}. Fix: use the jaxrl "
                          "version that wrote the run, or pass --config=<recipe> instead")
    return c


def load_engine(model: str, c: ml_collections.ConfigDict, *, dtype: Optional[str] = None, **sampler_kwargs):
    """A JAX engine (`jaxrl.rollout.sampler.Sampler`) holding the policy at `model`.

    Args:
      model: an HF checkpoint directory, a published version or a training checkpoint directory
        (module docstring).
      c: the run config (its `model.path` is the starting model of a published version or a
        training checkpoint).
      dtype: compute dtype of the engine; default `c.model.compute_dtype` (the dtype the run's
        rollouts and evaluations used).
      sampler_kwargs: `max_seq_len`, `max_batch_rows`, ... for the Sampler.
    Returns:
      (sampler, tokenizer_dir, description): the engine, the directory whose tokenizer and chat
      template go with it, and a short text naming what was loaded.
    Raises:
      PolicyError: `model` does not exist, or is none of those kinds of directory
        (`check_policy_dir`), or has no tokenizer; a training checkpoint whose params cannot be
        read or do not fit the starting model.
    """
    from jaxrl.envs import DEFAULT_POLICY_DIR
    from jaxrl.fileio import tokenizer_problem
    from jaxrl.rollout.sampler import sampler_from_hf

    dtype = dtype or c.model.compute_dtype
    check_policy_dir(model)
    base = c.model.path or DEFAULT_POLICY_DIR  # the starting model, under Orbax weights of the run
    number = os.path.basename(os.path.normpath(model))
    if is_sync_version(model):
        sampler = sampler_from_hf(base, dtype=dtype, **sampler_kwargs)
        _load_version(sampler, model, int(number))
        return sampler, base, f"policy version {number} ({model}) on {base}"
    if is_training_checkpoint(model):
        params = read_checkpoint_params(model)
        sampler = sampler_from_hf(base, dtype=dtype, **sampler_kwargs)
        try:
            sampler.set_params(params, policy_version=int(number))
        except ValueError as e:
            raise PolicyError(f"--model {model!r}: the checkpoint's params do not fit the run's starting model {base} "
                              f"({e}). Fix: pass the run config it was trained under (--config / --run_config)") from e
        return sampler, base, f"training checkpoint of step {number} ({model}) on {base}"
    problem = tokenizer_problem(model)
    if problem:
        raise PolicyError(f"--model: {problem}. Fix: copy the tokenizer files of the model it was trained from into it")
    return sampler_from_hf(model, dtype=dtype, **sampler_kwargs), model, f"HF checkpoint {model}"


def _load_version(sampler, model: str, version: int) -> None:
    """`sampler.load_version` of published version directory `model`, its failures (a damaged or
    incomplete version) as one PolicyError line without Orbax's abandoned-read tracebacks."""
    from jaxrl.fileio import read_error_text
    from jaxrl.train.checkpoint import quiet_read

    try:
        with quiet_read(model):
            sampler.load_version(os.path.abspath(model), version)
    except Exception as e:  # noqa: BLE001 - any failure to read is reported as one line
        raise PolicyError(f"--model {model!r}: published version {version} cannot be read ({read_error_text(e)}). "
                          "Fix: pass another version of WORKDIR/sync, a training checkpoint WORKDIR/checkpoints/<step> "
                          "or the run's best/") from e


def training_chat_template(tokenizer_dir: str, enable_thinking: bool, chat_template: str = ""):
    """The `ChatTemplate` of `tokenizer_dir` as the trainer used it: the chat template without the
    defaults an export baked in (`jaxrl.models.chat_template.strip_prompt_format`), with
    `enable_thinking` and the run's `generator.chat_template` ("" or "keep_thinking"; an export
    of a keep_thinking run already holds that template, which stays as it is).

    Raises:
      PolicyError: keep_thinking asked of a tokenizer whose template cannot keep past thinking.
    """
    from jaxrl.envs import ChatTemplate, load_tokenizer
    from jaxrl.envs.chat import ChatTemplateOptionError
    from jaxrl.models import chat_template as template_lib

    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.chat_template = template_lib.strip_prompt_format(tokenizer.chat_template)
    try:
        return ChatTemplate(tokenizer, enable_thinking=enable_thinking, chat_template=chat_template)
    except ChatTemplateOptionError as e:
        raise PolicyError(f"{tokenizer_dir}: the run's generator.chat_template=keep_thinking: {e.problem}. "
                          f"Fix: {e.fix}") from None


def baked_prompt_format(tokenizer_dir: str):
    """The `jaxrl.envs.chat.PromptFormat` a jaxrl export baked into the chat template of
    `tokenizer_dir` (`jaxrl.models.chat_template.bake_prompt_format`), or None."""
    from jaxrl.envs import load_tokenizer
    from jaxrl.envs.chat import PromptFormat
    from jaxrl.models import chat_template as template_lib

    meta = template_lib.read_prompt_format(load_tokenizer(tokenizer_dir).chat_template)
    if meta is None:
        return None
    return PromptFormat(meta["system_prompt"], bool(meta["enable_thinking"]),
                        num_system_prompts=int(meta["system_prompt"] is not None))


def describe(value: Any) -> str:
    """A short quoted form of a (possibly long) system prompt for one-line messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "...'"
