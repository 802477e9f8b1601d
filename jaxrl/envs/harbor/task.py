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

`task.toml` follows Harbor 0.26's `TaskConfig` (`harbor/models/task/config.py`). Every field of it is
either honoured or refused with one line naming the field (`TASK_TOML_FIELDS` lists them); keys that
are not Harbor fields are kept in `TaskConfig.raw` and otherwise ignored, as Harbor's model ignores
them. Honoured:

* top level: `schema_version` (older files: `version`), `source`, `[metadata]` (free form), `[task]`
  (`name`, `description`, `version`, `authors`, `keywords`);
* `[agent] timeout_sec` (Harbor's default: none, i.e. no limit; the trial's
  `max_agent_timeout_sec` caps it), `[verifier] timeout_sec` (600) and `env`, `[solution] env`;
  `env` values `${VAR}` / `${VAR:-default}` are taken from the host's environment, as Harbor does;
* `[environment]`: `cpus`, `memory_mb`, `storage_mb` (the deprecated `memory = "2G"` /
  `storage = "10G"` strings are converted to MB, and a conflict with `memory_mb` is refused);
  Harbor leaves them unset (the backend's default); the sandbox needs caps and uses 1 CPU, 2048 MB,
  10240 MB. `env` (set for every command of the trial, the verifier's included), `workdir` (on the
  profile path `/app` or below, like WORKDIR; any absolute path on the image backend), `os = "linux"`, `docker_image`, `gpus = 0`, `build_timeout_sec`
  (600: the trial's start (sandbox and shell) must finish within it, else `sandbox_error`),
  `network_mode = "no-network"` (what the sandbox gives), the deprecated `allow_internet`;
* `[agent] user` / `[verifier] user`: only the sandbox's own user (`agent`, uid 1000) or none.
* `[verifier] environment_mode = "separate"` with top-level `artifacts` (paths, or tables with a
  `source`): on the image backend only. The verifier then runs in its own container, built from
  `tests/Dockerfile` when there is one (else a fresh container of the task's image), and each artifact
  is copied from the agent's container to the same path in it (Harbor 0.26's "separate verifier";
  `Trial` docstring). The profile path refuses the mode, naming the image backend.

Refused (one line naming the field): fields that need a network policy or a health check
(`healthcheck`, a `network_mode` other than "no-network", `allowed_hosts`, in any table), GPUs and
TPUs, `mcp_servers`, `skills_dir`, another `os`, other users, `[verifier] environment` / `collect`,
multi-step tasks (`steps`, `multi_step_reward_strategy`), and `artifacts` without a separate verifier
(the shared verifier reads the agent's files in place).
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
import logging

_log = logging.getLogger(__name__)
from jaxrl.envs.harbor.profiles import EnvironmentSpec, resolve_environment

REQUIRED_FILES = ("instruction.md", "task.toml", "environment", "tests/test.sh")
DEFAULT_AGENT_TIMEOUT_SEC = None  # Harbor 0.26: AgentConfig.timeout_sec = None (no limit)
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
SANDBOX_USERS = (None, "agent", 1000, "1000")

IMAGE_BACKEND = "needs a built image, which this sandbox does not build (the image backend); remove it or the task"
TASK_TOML_FIELDS = {
    "": {"schema_version", "version", "source", "task", "metadata", "agent", "verifier", "environment", "solution",
         "steps", "multi_step_reward_strategy", "artifacts"},
    "task": {"name", "description", "version", "authors", "keywords"},
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "network_mode", "allowed_hosts", "environment_mode", "environment",
                 "collect"},
    "solution": {"env"},
    "environment": {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "memory",
                    "storage", "gpus", "gpu_types", "tpu", "mcp_servers", "env", "skills_dir", "healthcheck",
                    "workdir", "allow_internet", "network_mode", "allowed_hosts"},
}
"""Harbor 0.26's task.toml fields by table (module docstring: which are honoured, which refused)."""


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """The parsed `task.toml` (units: seconds, megabytes, CPUs).

    `agent_timeout_sec` None means "no limit" (Harbor 0.26's default); the trial's configured
    maximum then applies. `environment_env` and `workdir` are `[environment] env` / `workdir`.
    `verifier_mode` is `[verifier] environment_mode` ("shared" or "separate"); `artifacts` the absolute
    paths of the top-level `artifacts` (a separate verifier receives them).
    """

    schema_version: str = "1.0"
    name: Optional[str] = None
    agent_timeout_sec: Optional[float] = DEFAULT_AGENT_TIMEOUT_SEC
    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SEC
    environment_env: dict = dataclasses.field(default_factory=dict)
    workdir: Optional[str] = None
    verifier_timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    verifier_env: dict = dataclasses.field(default_factory=dict)
    solution_env: dict = dataclasses.field(default_factory=dict)
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    allow_internet: bool = True
    docker_image: Optional[str] = None
    verifier_mode: str = "shared"
    artifacts: tuple = ()
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


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\}")


def _env_table(table: dict, where: str) -> dict:
    """An `env` table, with Harbor's host templates resolved (`${VAR}`, `${VAR:-default}` as the whole
    value, from this process's environment)."""
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float)) and
                                            not isinstance(v, bool) for k, v in env.items()):
        raise HarborTaskError(f"{where}: `env` must be a table of string values")
    out = {}
    for k, v in env.items():
        v = str(v)
        m = _TEMPLATE.fullmatch(v)
        if m:
            if m.group(1) in os.environ:
                v = os.environ[m.group(1)]
            elif m.group(2) is not None:
                v = m.group(2)
            else:
                raise HarborTaskError(f"{where}: `env.{k} = {v!r}` needs the host environment variable {m.group(1)}; "
                                      "set it before loading the task")
        out[k] = v
    return out


def _refuse(where: str, field: str, why: str):
    raise HarborTaskError(f"{where}: task.toml field `{field}` is not supported: {why}")


def _check_fields(doc: dict, where: str) -> None:
    """Refuses the Harbor fields this sandbox cannot honour (module docstring), naming the field."""
    def present(table: dict, key: str) -> bool:
        return key in table and table[key] not in (None, [], {}, "")

    for key in ("steps", "multi_step_reward_strategy"):
        if present(doc, key):
            _refuse(where, key, "multi-step tasks are not supported; use single-step tasks")
    v = doc.get("verifier", {}) if isinstance(doc.get("verifier", {}), dict) else {}
    if present(doc, "artifacts") and v.get("environment_mode") != "separate":
        _refuse(where, "artifacts", "artifacts are collected only for a separate verifier ([verifier] "
                "environment_mode = \"separate\", image backend); the shared verifier reads the files in place: "
                "remove it")
    for tname in ("agent", "verifier", "environment"):
        t = doc.get(tname, {})
        if not isinstance(t, dict):
            continue
        mode = t.get("network_mode")
        if mode is not None and mode != "no-network":
            _refuse(where, f"[{tname}] network_mode = {mode!r}", f"a network policy {IMAGE_BACKEND}; the sandbox has "
                    "no network (network_mode = \"no-network\")")
        if present(t, "allowed_hosts"):
            _refuse(where, f"[{tname}] allowed_hosts", f"a network allowlist {IMAGE_BACKEND}")
        if tname in ("agent", "verifier") and t.get("user") not in SANDBOX_USERS:
            _refuse(where, f"[{tname}] user = {t.get('user')!r}", "commands run as the sandbox's user `agent` "
                    "(uid 1000); remove the field or set it to \"agent\"")
    for key in ("environment", "collect"):
        if present(v, key):
            _refuse(where, f"[verifier] {key}", "a verifier environment table or collection step is not supported "
                    "(environment_mode = \"separate\" with tests/Dockerfile is)")
    mode = v.get("environment_mode")
    if mode not in (None, "shared", "separate"):
        _refuse(where, f"[verifier] environment_mode = {mode!r}", "use \"shared\" or \"separate\"")
    e = doc.get("environment", {}) if isinstance(doc.get("environment", {}), dict) else {}
    if present(e, "healthcheck"):
        _refuse(where, "[environment] healthcheck", IMAGE_BACKEND)
    if e.get("os") not in (None, "linux", "Linux", "LINUX"):
        _refuse(where, f"[environment] os = {e.get('os')!r}", "the sandbox is Linux")
    gpus = e.get("gpus", 0)
    if gpus not in (0, None):
        _refuse(where, f"[environment] gpus = {gpus!r}", "GPU tasks are not supported by the local sandbox; remove "
                "the task from the set")
    for key in ("gpu_types", "tpu"):
        if present(e, key):
            _refuse(where, f"[environment] {key}", "accelerator tasks are not supported by the local sandbox")
    if present(e, "mcp_servers"):
        _refuse(where, "[environment] mcp_servers", "MCP servers are not supported; remove them")
    if present(e, "skills_dir"):
        _refuse(where, "[environment] skills_dir", "agent skills are not supported; remove it")


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
    _check_fields(doc, where)

    def size(new_key: str, old_key: str, default: int) -> int:
        value = int(_num(env, new_key, f"{where}: [environment]", default)) if env.get(new_key) is not None else None
        if old_key in env:
            old = _size_to_mb(env[old_key], f"{where}: [environment] {old_key}")
            if value is not None and value != old:
                raise HarborTaskError(f"{where}: `[environment] {old_key} = {env[old_key]!r}` ({old} MB) conflicts "
                                      f"with `{new_key} = {value}`; keep one of them")
            value = old
        return default if value is None else value

    memory_mb = size("memory_mb", "memory", 2048)
    storage_mb = size("storage_mb", "storage", 10240)
    workdir = env.get("workdir")
    if workdir is not None:
        if not isinstance(workdir, str) or not workdir.startswith("/") or ".." in workdir.split("/"):
            raise HarborTaskError(f"{where}: `[environment] workdir = {workdir!r}` must be an absolute path "
                                  "without '..', e.g. \"/app\"")
        workdir = os.path.normpath(workdir)  # the profile path also needs it under /app (`load_task`)
    allow_internet = env.get("allow_internet", True)
    if allow_internet is None:
        allow_internet = True
    if env.get("network_mode") == "no-network":
        allow_internet = False
    if not isinstance(allow_internet, bool):
        raise HarborTaskError(f"{where}: `[environment] allow_internet` must be true or false")
    image = env.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise HarborTaskError(f"{where}: `[environment] docker_image` must be a string")
    artifacts = []
    for a in doc.get("artifacts") or []:
        src = a.get("source") if isinstance(a, dict) else a
        if not isinstance(src, str) or not src.startswith("/") or ".." in src.split("/") or src.rstrip("/") == "":
            raise HarborTaskError(f"{where}: `artifacts` entry {a!r} must be an absolute path (or a table with "
                                  "one as `source`) without '..', e.g. \"/root/results/out.json\"")
        artifacts.append(os.path.normpath(src))
    return TaskConfig(
        schema_version=str(version),
        name=name,
        agent_timeout_sec=_num(agent, "timeout_sec", f"{where}: [agent]", DEFAULT_AGENT_TIMEOUT_SEC,
                               allow_none=True),
        build_timeout_sec=float(_num(env, "build_timeout_sec", f"{where}: [environment]", DEFAULT_BUILD_TIMEOUT_SEC)),
        environment_env=_env_table(env, f"{where}: [environment]"),
        workdir=workdir,
        verifier_timeout_sec=float(_num(verifier, "timeout_sec", f"{where}: [verifier]",
                                        DEFAULT_VERIFIER_TIMEOUT_SEC)),
        verifier_env=_env_table(verifier, f"{where}: [verifier]"),
        solution_env=_env_table(solution, f"{where}: [solution]"),
        cpus=float(_num(env, "cpus", f"{where}: [environment]", 1.0) if env.get("cpus") is not None else 1.0),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        allow_internet=allow_internet,
        docker_image=image,
        verifier_mode=str(verifier.get("environment_mode") or "shared"),
        artifacts=tuple(artifacts),
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


_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """Harbor's instruction rule: leading canary marker lines (an HTML or `#` comment with the word
    "canary") and the blank lines after them (leading blank lines in any case) are not shown to the
    agent."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def load_task(path: str | os.PathLike, *, source: str = "", environment_backend: str = "profile") -> HarborTask:
    """Loads and validates one Harbor task directory.

    Checks Harbor's validity rule (`instruction.md`, `task.toml`, `environment/`, `tests/test.sh`),
    parses task.toml, resolves the environment to a sandbox profile (`profiles.resolve_environment`)
    and rejects symlinks that leave the task.

    Args:
      path: the task directory.
      source: label for messages (default: the path).
      environment_backend: "profile" (read the Dockerfile against host profiles), "image" (build it:
        `images.py`; the environment's profile is then "image") or "auto" (profile when the Dockerfile
        loads as one, else image; a task with only `[environment] docker_image` takes that image).

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
    environment = _environment(p, config, where, environment_backend)
    if environment.profile != "image" and config.workdir and not (config.workdir == "/app"
                                                                  or config.workdir.startswith("/app/")):
        raise HarborTaskError(f"{where}/task.toml: `[environment] workdir = {config.workdir!r}` must be /app or "
                              "below it on the profile path (the sandbox's only writable work directory); the "
                              "image backend takes any path (harbor.environment_backend='image' or 'auto', "
                              "--environment-backend image)")
    if environment.profile != "image" and (config.environment_env or config.workdir):
        environment = dataclasses.replace(
            environment, env=tuple(environment.env) + tuple(config.environment_env.items()),
            workdir=config.workdir or environment.workdir)
    instruction = strip_canary(instruction)
    return HarborTask(name=config.name or p.name, path=p, instruction=instruction, config=config,
                      environment=environment, source=where)


def _environment(p: Path, config: TaskConfig, where: str, backend: str):
    from jaxrl.envs.harbor.images import BACKENDS, image_spec
    from jaxrl.envs.harbor.errors import UnsupportedEnvironmentError

    if backend not in BACKENDS:
        raise HarborTaskError(f"harbor.environment_backend={backend!r}: use one of {list(BACKENDS)}")
    prebuilt = config.docker_image and not (p / "environment" / "Dockerfile").is_file()
    separate = config.verifier_mode == "separate"
    # auto: what the profile path cannot take goes to the image backend (a workdir outside /app, too)
    outside_app = config.workdir is not None and not (config.workdir == "/app" or config.workdir.startswith("/app/"))
    if separate and backend == "profile":
        _refuse(where, '[verifier] environment_mode = "separate"', "on the profile path; a separate verifier "
                "container needs the image backend: set harbor.environment_backend='image' or 'auto' "
                "(python -m jaxrl.tasks: --environment-backend image)")
    if separate and not config.artifacts:
        _log.warning("task %s: a separate verifier and no `artifacts`: its container gets nothing from the "
                     "agent's but /logs/artifacts (list the paths test.sh reads in task.toml's `artifacts`)", where)
    if backend == "image" or (backend == "auto" and (prebuilt or separate or outside_app)):
        # auto: a prebuilt image holds what it holds (only a Dockerfile can be read against a profile)
        spec = image_spec(p / "environment", config, f"{where}/environment")
    else:
        try:
            spec = resolve_environment(p / "environment", config.docker_image, where=f"{where}/environment")
        except UnsupportedEnvironmentError as e:
            if backend == "profile":
                raise
            _log.info("task %s: the profile path refuses it (%s); building its image", where, e)
            spec = image_spec(p / "environment", config, f"{where}/environment")
    _log.info("task %s: environment backend %s", where, "image" if spec.profile == "image" else f"profile {spec.profile}")
    return spec


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
                  skip_invalid: bool = False, errors: list | None = None,
                  environment_backend: str = "profile") -> list[HarborTask]:
    """Loads a task set: one task directory, a folder of tasks, or a DCAgent `.parquet` file.

    Args:
      path: the directory or Parquet file.
      extract_dir: where Parquet tasks are unpacked (default: a `<file>.tasks/` folder next to it).
      skip_invalid: drop invalid tasks instead of raising; each is logged, or, if `errors` is given,
        appended to it as `(source, message)`.
      errors: see `skip_invalid`.
      environment_backend: "profile" | "image" | "auto", as `load_task`.

    Returns:
      The tasks, sorted by name (names must be unique).

    Raises:
      FileNotFoundError: `path` does not exist.
      HarborTaskError: an invalid task (unless `skip_invalid`), no task found, or duplicate names.
    """
    import logging

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task set {str(path)!r} does not exist. Fix: pass a Harbor task directory, a "
                                "folder of tasks or a DCAgent .parquet file")
    if path.is_file():
        if path.suffix != ".parquet":
            raise HarborTaskError(f"{path}: a task set is a task directory, a folder of tasks or a .parquet file")
        from jaxrl.envs.harbor.archive import extract_parquet

        dirs = [(d, src) for d, src in extract_parquet(path, extract_dir)]
    else:
        dirs = [(d, str(d)) for d in find_task_dirs(path)]
    if not dirs:
        old_format = sorted(str(q.parent) for q in path.rglob("task.yaml")) if path.is_dir() else []
        if old_format:
            raise HarborTaskError(f"{old_format[0]}: a task in the older terminal-bench format (task.yaml, "
                                  "run-tests.sh), which jaxrl does not read; it reads Harbor's layout (instruction.md, "
                                  "task.toml, tests/test.sh, docs/terminal_tasks.md): convert the task to it")
        raise HarborTaskError(f"{path}: no task found (no directory with an instruction.md); a Harbor task is a "
                              "directory with instruction.md, task.toml and tests/test.sh (docs/terminal_tasks.md)")
    tasks = []
    for d, src in dirs:
        try:
            tasks.append(load_task(d, source=src, environment_backend=environment_backend))
        except HarborTaskError as e:
            if not skip_invalid:
                raise
            if errors is not None:  # the caller reports them (said once, not also as a log warning)
                errors.append((src, str(e)))
            else:
                logging.getLogger(__name__).warning("skipping invalid task: %s", e)
    names: dict[str, str] = {}
    for t in tasks:
        if t.name in names:
            raise HarborTaskError(f"{path}: two tasks are named {t.name!r} ({names[t.name]} and {t.source}); "
                                  "task names must be unique within a set")
        names[t.name] = t.source
    return sorted(tasks, key=lambda t: t.name)
