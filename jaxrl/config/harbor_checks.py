"""The checks of the `harbor.*` keys and the Harbor-only `data.*` keys that need more than one
key or the file system (`check_harbor`), and the image-backend settings they describe
(`base_image_pairs`, `image_cache_config`). The single-key checks are the Fields' (schema.py)."""
from __future__ import annotations

import os

import ml_collections

from jaxrl.config.schema import field_problems
from jaxrl.errors import ConfigError


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


def _require(cond: bool, key: str, problem: str, fix: str):
    """Raises `ConfigError(key, problem, fix)` unless `cond`."""
    if not cond:
        raise ConfigError(key, problem, fix)


def _is_harbor_run(c: ml_collections.ConfigDict) -> bool:
    """True when the run trains on Harbor tasks: data.task=harbor, or data.task=dataset with a
    dataset_path that is a Harbor task set (a directory, a DCAgent Parquet, a family spec)."""
    if c.data.task == "harbor":
        return True
    if c.data.task != "dataset" or not c.data.dataset_path:
        return False
    from jaxrl.envs.harbor.dataset import is_task_set

    return is_task_set(c.data.dataset_path)


def check_harbor(c: ml_collections.ConfigDict, check_inputs: bool) -> None:
    """The `harbor.*` checks beyond a single key's Field: the prompt style (a registry), the error
    policy, Terminus-2's texts, base images, the mirrors on disk, and a Harbor run's held-out set.
    Raises: ConfigError naming the key and the fix."""
    from jaxrl.envs.harbor.agent import PROMPT_STYLES

    h, d = c.harbor, c.data
    _require(h.prompt_style in PROMPT_STYLES, "harbor.prompt_style", f"unknown style {h.prompt_style!r}",
             f"use one of {list(PROMPT_STYLES)}")
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
    try:
        base_image_pairs(h.base_images)
    except ValueError as e:
        raise ConfigError("harbor.base_images", str(e), "use entries like 'ubuntu:24.04=localhost/debian-stand-in:bookworm'") from None
    if h.pip_mirror and check_inputs and _is_harbor_run(c):
        _require(os.path.isdir(h.pip_mirror), "harbor.pip_mirror", f"{h.pip_mirror!r} is not a directory",
                 "make it with `pip download -d DIR PKG==VER ...` (docs/terminal_tasks.md, 'Network'), or use ''")
    if h.tool_mirror and check_inputs and _is_harbor_run(c):
        _require(os.path.isdir(os.path.join(h.tool_mirror, "bin")), "harbor.tool_mirror",
                 f"{h.tool_mirror!r} has no bin/ folder",
                 "make it with `launch/make_tool_mirror.sh DIR --uv VER` (docs/terminal_tasks.md, 'Network'), or use ''")
    if d.task == "harbor":
        _require(not d.eval_task, "data.eval_task", f"{d.eval_task!r}: a built-in task cannot evaluate a Harbor run",
                 "drop data.eval_task; give held-out Harbor tasks with data.eval_dataset_path")
    if d.eval_dataset_path and check_inputs and _is_harbor_run(c):
        from jaxrl.envs.harbor.dataset import spec_exists

        _require(spec_exists(d.eval_dataset_path), "data.eval_dataset_path", f"{d.eval_dataset_path!r} does not exist",
                 "point it at a Harbor task directory, folder, DCAgent .parquet or family:<name>:<first>-<last>")


def validate_harbor(c: ml_collections.ConfigDict, check_inputs: bool) -> None:
    """The checks of the `harbor.*` keys alone: each key against its Field, then `check_harbor`.
    Raises: ConfigError naming the key and the fix."""
    for key, problem, fix in field_problems(c):
        if key.startswith("harbor."):
            raise ConfigError(key, problem, fix)
    check_harbor(c, check_inputs)
