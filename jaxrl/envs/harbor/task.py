"""Harbor task directories: `task.toml` parsing, validation and task-set loading.

A Harbor task is a directory (Harbor's `TaskPaths`)::

    instruction.md        the only prompt text the agent sees
    task.toml             timeouts, resources, metadata (schema below)
    environment/          the image build context (Dockerfile; see `profiles.py`)
    tests/test.sh         the verifier, with any test files; copied to /tests only at verification
    solution/solve.sh     optional oracle, copied to /solution only for the oracle agent

A *task set* is one task directory, a folder of them (searched recursively: every directory holding
an `instruction.md` is a task), or a DCAgent Parquet file (columns `path`, `task_binary` = tar.gz of
one task; see `archive.py`).

`task.toml` (Harbor `src/harbor/models/task/config.py`): top-level `schema_version` (older files:
`version`), `[task] name`, `[metadata]` (free form), `[agent] timeout_sec`, `[verifier] timeout_sec`
and `env`, `[solution] env`, `[environment] cpus / memory_mb / storage_mb / allow_internet /
docker_image / build_timeout_sec` (deprecated `memory = "2G"` / `storage = "10G"` strings are
converted to MB). Unknown keys are kept in `TaskConfig.raw` and otherwise ignored (Harbor adds keys
over time). Defaults are Harbor's: agent and verifier 600 s, 1 CPU, 2048 MB memory, 10240 MB storage,
internet allowed (the sandbox still runs without network unless the operator enables it).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path
from typing import Any, Optional

from jaxrl.envs.harbor.errors import HarborTaskError
from jaxrl.envs.harbor.profiles import EnvironmentSpec, resolve_environment

REQUIRED_FILES = ("instruction.md", "task.toml", "environment", "tests/test.sh")
DEFAULT_AGENT_TIMEOUT_SEC = 600.0
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The parsed `task.toml` (units: seconds, megabytes, CPUs).

    `agent_timeout_sec` None means "no limit" (Harbor@HEAD semantics); the trial's configured
    maximum then applies.
    """

    schema_version: str = "1.0"
    name: Optional[str] = None
    agent_timeout_sec: Optional[float] = DEFAULT_AGENT_TIMEOUT_SEC
    verifier_timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    verifier_env: dict = dataclasses.field(default_factory=dict)
    solution_env: dict = dataclasses.field(default_factory=dict)
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    allow_internet: bool = True
    docker_image: Optional[str] = None
    metadata: dict = dataclasses.field(default_factory=dict)
    raw: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HarborTask:
    """One loaded and validated task.

    Attributes:
      name: `[task] name` from task.toml, else the directory name.
      path: the task directory (absolute).
      instruction: the text of `instruction.md`.
      config: the parsed `task.toml`.
      environment: the resolved sandbox environment (profile, workdir, env vars, files for /app).
      source: where the task came from (the directory, or `file.parquet:row N`).
    """

    name: str
    path: Path
    instruction: str
    config: TaskConfig
    environment: EnvironmentSpec
    source: str = ""

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_oracle(self) -> bool:
        return (self.path / "solution" / "solve.sh").is_file()


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def _size_to_mb(value: Any, where: str) -> int:
    """Harbor's deprecated size strings ("512M", "2G", "1.5g") to MB; numbers are taken as MB."""
    if isinstance(value, bool):
        raise HarborTaskError(f"{where}: expected a size like \"2G\" or a number of MB, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise HarborTaskError(f"{where}: expected a size like \"512M\" or \"2G\", got {value!r}")
    scale = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[m.group(2).lower()]
    return max(1, int(float(m.group(1)) * scale))


def _num(table: dict, key: str, where: str, default, *, allow_none=False, positive=True):
    if key not in table:
        return default
    v = table[key]
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise HarborTaskError(f"{where}: `{key}` must be a positive number, got {v!r}")
    return v


def _table(doc: dict, key: str, where: str) -> dict:
    v = doc.get(key, {})
    if not isinstance(v, dict):
        raise HarborTaskError(f"{where}: `[{key}]` must be a table, got {type(v).__name__}")
    return v


def _env_table(table: dict, where: str) -> dict:
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float)) and
                                            not isinstance(v, bool) for k, v in env.items()):
        raise HarborTaskError(f"{where}: `env` must be a table of string values")
    return {k: str(v) for k, v in env.items()}


def parse_task_toml(text: str, where: str = "task.toml") -> TaskConfig:
    """Parses a Harbor `task.toml` (old `version` or new `schema_version` schema).

    Args:
      text: the file content.
      where: a label for error messages (the file path).

    Raises:
      HarborTaskError: invalid TOML or a field of the wrong type / out of range (named in the message).
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"{where}: not valid TOML ({e})") from None
    version = doc.get("schema_version", doc.get("version", "1.0"))
    task = _table(doc, "task", where)
    agent = _table(doc, "agent", where)
    verifier = _table(doc, "verifier", where)
    solution = _table(doc, "solution", where)
    env = _table(doc, "environment", where)
    metadata = _table(doc, "metadata", where)
    name = task.get("name")
    if name is not None and not isinstance(name, str):
        raise HarborTaskError(f"{where}: `[task] name` must be a string")
    if "memory_mb" in env:
        memory_mb = int(_num(env, "memory_mb", f"{where}: [environment]", 2048))
    elif "memory" in env:
        memory_mb = _size_to_mb(env["memory"], f"{where}: [environment] memory")
    else:
        memory_mb = 2048
    if "storage_mb" in env:
        storage_mb = int(_num(env, "storage_mb", f"{where}: [environment]", 10240))
    elif "storage" in env:
        storage_mb = _size_to_mb(env["storage"], f"{where}: [environment] storage")
    else:
        storage_mb = 10240
    allow_internet = env.get("allow_internet", True)
    if not isinstance(allow_internet, bool):
        raise HarborTaskError(f"{where}: `[environment] allow_internet` must be true or false")
    image = env.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise HarborTaskError(f"{where}: `[environment] docker_image` must be a string")
    gpus = env.get("gpus", 0)
    if gpus not in (0, None):
        raise HarborTaskError(f"{where}: `[environment] gpus = {gpus!r}`: GPU tasks are not supported by "
                              "the local sandbox; remove the task from the set")
    return TaskConfig(
        schema_version=str(version),
        name=name,
        agent_timeout_sec=_num(agent, "timeout_sec", f"{where}: [agent]", DEFAULT_AGENT_TIMEOUT_SEC,
                               allow_none=True),
        verifier_timeout_sec=float(_num(verifier, "timeout_sec", f"{where}: [verifier]",
                                        DEFAULT_VERIFIER_TIMEOUT_SEC)),
        verifier_env=_env_table(verifier, f"{where}: [verifier]"),
        solution_env=_env_table(solution, f"{where}: [solution]"),
        cpus=float(_num(env, "cpus", f"{where}: [environment]", 1.0)),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        allow_internet=allow_internet,
        docker_image=image,
        metadata=dict(metadata),
        raw=doc,
    )


def _check_inside(root: Path, where: str) -> None:
    """Every symlink inside a task must point inside the task (the host copies and binds these files)."""
    root_real = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                target = os.path.realpath(p)
                if os.path.commonpath([root_real, target]) != root_real:
                    raise HarborTaskError(f"{where}: {os.path.relpath(p, root)} is a symlink leaving the task "
                                          f"(-> {os.readlink(p)}); tasks may only link inside themselves")


def load_task(path: str | os.PathLike, *, source: str = "") -> HarborTask:
    """Loads and validates one Harbor task directory.

    Checks Harbor's validity rule (`instruction.md`, `task.toml`, `environment/`, `tests/test.sh`),
    parses task.toml, resolves the environment to a sandbox profile (`profiles.resolve_environment`)
    and rejects symlinks that leave the task.

    Raises:
      HarborTaskError: naming the task path and the missing or invalid piece.
    """
    p = Path(path).resolve()
    where = source or str(p)
    if not p.is_dir():
        raise HarborTaskError(f"{where}: not a directory (a Harbor task is a directory with {', '.join(REQUIRED_FILES)})")
    missing = [f for f in REQUIRED_FILES if not (p / f).exists()]
    if missing:
        raise HarborTaskError(f"{where}: not a valid Harbor task: missing {', '.join(missing)} "
                              f"(a task needs {', '.join(REQUIRED_FILES)})")
    if not (p / "environment").is_dir():
        raise HarborTaskError(f"{where}: `environment` must be a directory (the image build context)")
    if (p / "solution").exists() and not (p / "solution" / "solve.sh").is_file():
        raise HarborTaskError(f"{where}: has solution/ but no solution/solve.sh (the oracle's entry point)")
    _check_inside(p, where)
    config = parse_task_toml((p / "task.toml").read_text(encoding="utf-8"), f"{where}/task.toml")
    instruction = (p / "instruction.md").read_text(encoding="utf-8")
    if not instruction.strip():
        raise HarborTaskError(f"{where}: instruction.md is empty")
    environment = resolve_environment(p / "environment", config.docker_image, where=f"{where}/environment")
    return HarborTask(name=config.name or p.name, path=p, instruction=instruction, config=config,
                      environment=environment, source=where)


def find_task_dirs(root: str | os.PathLike) -> list[Path]:
    """Every directory under `root` (itself included) that holds an `instruction.md`, sorted; a task's
    own subdirectories are not searched."""
    root = Path(root)
    if (root / "instruction.md").exists():
        return [root]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if "instruction.md" in filenames:
            found.append(Path(dirpath))
            dirnames[:] = []
    return sorted(found)


def load_task_set(path: str | os.PathLike, *, extract_dir: str | os.PathLike | None = None,
                  skip_invalid: bool = False, errors: list | None = None) -> list[HarborTask]:
    """Loads a task set: one task directory, a folder of tasks, or a DCAgent `.parquet` file.

    Args:
      path: the directory or Parquet file.
      extract_dir: where Parquet tasks are unpacked (default: a `<file>.tasks/` folder next to it).
      skip_invalid: drop invalid tasks instead of raising; each is logged and, if `errors` is given,
        appended to it as `(source, message)`.
      errors: see `skip_invalid`.

    Returns:
      The tasks, sorted by name (names must be unique).

    Raises:
      FileNotFoundError: `path` does not exist.
      HarborTaskError: an invalid task (unless `skip_invalid`), no task found, or duplicate names.
    """
    import logging

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task set {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix != ".parquet":
            raise HarborTaskError(f"{path}: a task set is a task directory, a folder of tasks or a .parquet file")
        from jaxrl.envs.harbor.archive import extract_parquet

        dirs = [(d, src) for d, src in extract_parquet(path, extract_dir)]
    else:
        dirs = [(d, str(d)) for d in find_task_dirs(path)]
    if not dirs:
        raise HarborTaskError(f"{path}: no task found (no directory with an instruction.md)")
    tasks = []
    for d, src in dirs:
        try:
            tasks.append(load_task(d, source=src))
        except HarborTaskError as e:
            if not skip_invalid:
                raise
            logging.getLogger(__name__).warning("skipping invalid task: %s", e)
            if errors is not None:
                errors.append((src, str(e)))
    names: dict[str, str] = {}
    for t in tasks:
        if t.name in names:
            raise HarborTaskError(f"{path}: two tasks are named {t.name!r} ({names[t.name]} and {t.source}); "
                                  "task names must be unique within a set")
        names[t.name] = t.source
    return sorted(tasks, key=lambda t: t.name)
