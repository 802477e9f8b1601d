"""Run configuration: the schema of every key, its validation, recipes and the `rl_config.json` dump.

A recipe (configs/*.py) returns an `ml_collections.ConfigDict` built from `base_config()`; keys
read like SkyRL's where the concept is the same (`trainer.algorithm.*`, `generator.*`), so a
recipe ports over by name. `validate(config)` runs before any work starts and raises
`ConfigError` naming the key and the fix.

Every key is declared once, as a `Field` (type, default, bounds or choices, meaning, source):

  field.py       Field: one key's declaration and the check of one value against it
  schema.py      FIELDS (every key, in rl_config.json order), base_config(), KEY_DOCS, flatten
  algorithm.py   the trainer.algorithm Fields; jaxrl.rl.LossConfig / AdvantageConfig are built from them
  validate.py    validate(): the Fields' checks, then the cross-key checks, each a named function
  harbor_checks.py  the harbor.* cross-key and file-system checks
  derived.py     loss_config(), advantage_config() and the other values derived from a config
  recipes.py     load_recipe() and the one-line errors of a recipe or a mistyped key
  scales.py      apply_scale(): the cpu / qwen3_8b scales
  docs.py        docs/config.md, generated from FIELDS
  __main__.py    python -m jaxrl.config show|diff (jaxrl/config_cli.py)

Scales: the same recipe file takes a config string (`configs/rloo.py:qwen3_8b`); the default
(no string) is the CPU scale that trains the embedded default policy on the built-in task.
"""
from __future__ import annotations

from jaxrl.config.derived import (
    advantage_config,
    logprob_definitions,
    logprob_diff_warn_threshold,
    loss_config,
    needs_critic,
    needs_reference,
    rollout_max_seq_len,
    to_json_dict,
    write_json_atomic,
)
from jaxrl.config.field import Field
from jaxrl.config.harbor_checks import _is_harbor_run, base_image_pairs, image_cache_config
from jaxrl.config.harbor_checks import validate_harbor as _validate_harbor  # the name callers know
from jaxrl.config.recipes import (
    RECIPE_FIX,
    key_sections,
    load_recipe,
    nearest_key,
    recipe_error,
    recipe_file_problem,
    unknown_key_hint,
)
from jaxrl.config.scales import SCALES, apply_scale
from jaxrl.config.schema import FIELDS, FIELDS_BY_KEY, KEY_DOCS, base_config, field_problems, flatten, key_type
from jaxrl.config.validate import ASYNC_MODES, check_inputs_first, validate
from jaxrl.errors import ConfigError  # public here; defined below config, as jaxrl.gpu_memory raises it too

__all__ = [
    "ASYNC_MODES", "ConfigError", "FIELDS", "FIELDS_BY_KEY", "Field", "KEY_DOCS", "RECIPE_FIX", "SCALES",
    "advantage_config", "apply_scale", "base_config", "base_image_pairs", "check_inputs_first", "field_problems",
    "flatten", "image_cache_config", "key_sections", "key_type", "load_recipe", "logprob_definitions",
    "logprob_diff_warn_threshold", "loss_config", "nearest_key", "needs_critic", "needs_reference", "recipe_error",
    "recipe_file_problem", "rollout_max_seq_len", "to_json_dict", "unknown_key_hint", "validate",
    "write_json_atomic",
]
