"""Task environments without Docker: a task's Dockerfile is mapped to a host-side *profile*.

Dockerfiles cannot be built here. The DCAgent Python sets all use near-identical images
(`FROM ubuntu:24.04`, `apt-get install python3 python3-pip ...`, `pip install pytest`,
`WORKDIR /app`), so each Dockerfile is *read*, not built: every instruction must be one the
sandbox can honour with what the host already has, otherwise the task is refused with a message
naming the Dockerfile line and instruction. What is honoured:

* `FROM image` — the image must match a registered profile's `base_images` (fnmatch patterns).
  Multi-stage builds are refused.
* `RUN` — only `&&`/`;` chains of: `apt-get`/`apt` `update|install|clean|autoremove` of packages the
  profile provides (`apt_packages`, or a package whose program exists on the host, `APT_PROGRAMS`),
  `pip install` of packages the profile's Python can import (versions are not checked),
  `mkdir -p` under the work directory, `rm -rf` of apt caches, `ln -s` of python3 to python,
  `true` and tests (`[ ... ]`, `test`); `||` chains too. A RUN whose text is not a JSON array of
  strings is shell form (Docker's rule, `exec_form`), even when it starts with `[`. Anything else is
  refused.
* `SHELL` — only the JSON form of sh or bash ending in `-c` (noted; RUN lines are read as shell).
* `WORKDIR` — must be `/app` or below (the only writable work directory of the sandbox).
* `ENV` / `ARG` — set (ENV) or define (ARG) variables, with `$VAR` / `${VAR}` expansion.
* `COPY` / `ADD` of local files from the build context into the work directory: copied into the
  trial's `/app` at start. `--from`, URLs and archives are refused; `--chown` is ignored.
* `USER root`, `LABEL`, `MAINTAINER`, `CMD`, `ENTRYPOINT`, `EXPOSE`, `HEALTHCHECK`, `STOPSIGNAL`,
  `VOLUME` — ignored (recorded in `EnvironmentSpec.notes`). Other instructions are refused.

Profiles are extendable: `register_profile(Profile(...))` adds one (tried before the built-ins).
Built-ins: `shell` (the host's /usr: bash, coreutils and the programs in `APT_PROGRAMS`) and
`python` (the same plus a Python that can import pytest, bound read-only; see `find_python`).

The Python of the `python` profile: `python_runtime.find_python` (the order it tries is in
`python_runtime`'s module docstring).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import posixpath
import re
import shlex
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.dockerfile import _dockerfile_lines, _expand, _split_chain, exec_form
from jaxrl.envs.harbor.errors import UnsupportedEnvironmentError
from jaxrl.envs.harbor.python_runtime import PythonRuntime, _importable, _under, find_python  # noqa: F401

SANDBOX_WORKDIR = "/app"
SANDBOX_PATH = "/opt/jaxrl/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SANDBOX_OWNED = ("/logs", "/tests", "/solution", "/tmp")

# apt package -> a program whose presence on the host (under /usr or /bin) means the package is there.
APT_PROGRAMS = {
    "bash": "bash", "coreutils": "ls", "grep": "grep", "sed": "sed", "gawk": "gawk", "mawk": "mawk",
    "findutils": "find", "diffutils": "diff", "util-linux": "setsid", "bsdutils": "script",
    "bsdmainutils": "column", "procps": "ps", "psmisc": "killall", "file": "file", "less": "less",
    "curl": "curl", "wget": "wget", "git": "git", "jq": "jq", "tree": "tree", "vim": "vim",
    "vim-tiny": "vi", "nano": "nano", "zip": "zip", "unzip": "unzip", "tar": "tar", "gzip": "gzip",
    "bzip2": "bzip2", "xz-utils": "xz", "bc": "bc", "make": "make", "gcc": "gcc", "g++": "g++",
    "build-essential": "gcc", "sqlite3": "sqlite3", "tmux": "tmux", "patch": "patch",
    "openssl": "openssl", "time": "time", "ripgrep": "rg", "moreutils": "sponge", "rsync": "rsync",
}
# Packages with nothing to run (data / apt plumbing): installing them is a no-op.
APT_NOOP = frozenset({"ca-certificates", "apt-utils", "apt-transport-https", "tzdata", "locales",
                      "gnupg", "lsb-release", "software-properties-common", "debconf-utils"})
PYTHON_APT = frozenset({"python3", "python3-pip", "python3-venv", "python3-dev", "python-is-python3",
                        "python3-pytest", "python3-setuptools", "python3-wheel", "python3-full",
                        "python3-minimal"})
# pip distribution name -> import name, where they differ.
PIP_IMPORT_NAMES = {"pytest-timeout": "pytest_timeout", "pyyaml": "yaml", "scikit-learn": "sklearn",
                    "pillow": "PIL", "beautifulsoup4": "bs4", "python-dateutil": "dateutil"}
_BASE_IMAGES = ("ubuntu:*", "ubuntu", "debian:*", "debian", "python:3*", "python",
                "ghcr.io/laude-institute/t-bench/ubuntu-*", "ghcr.io/laude-institute/t-bench/python-*")


@dataclasses.dataclass(frozen=True)
class Profile:
    """A host-side stand-in for a family of Docker images.

    Attributes:
      name: identifier recorded in `EnvironmentSpec.profile`.
      description: one line for `python -m jaxrl.tasks list`.
      base_images: fnmatch patterns of the `FROM` images (or `docker_image`s) it stands in for.
      apt_packages: apt packages it provides beyond the host programs in `APT_PROGRAMS`.
      python: whether it binds a Python that can import pytest (`find_python`) and serves
        `pip install` of any package that Python can import.
    """

    name: str
    description: str
    base_images: tuple[str, ...] = _BASE_IMAGES
    apt_packages: frozenset = frozenset()
    python: bool = False


_PROFILES: list[Profile] = [
    Profile("shell", "host /usr (bash, coreutils, common tools), no Python with pytest"),
    Profile("python", "host /usr plus a Python that can import pytest (read-only)",
            apt_packages=PYTHON_APT, python=True),
]


def register_profile(profile: Profile) -> None:
    """Adds a profile; profiles registered later are tried first. A same-named profile is replaced."""
    _PROFILES[:] = [p for p in _PROFILES if p.name != profile.name]
    _PROFILES.insert(0, profile)


def get_profile(name: str) -> Profile:
    for p in _PROFILES:
        if p.name == name:
            return p
    raise KeyError(f"no sandbox profile named {name!r}; known: {[p.name for p in _PROFILES]}")


def profiles() -> list[Profile]:
    return list(_PROFILES)


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
    """What a trial's sandbox must provide for one task (the result of reading its Dockerfile).

    Attributes:
      profile: the chosen profile's name.
      base_image: the `FROM` image (or `docker_image`).
      workdir: the sandbox working directory (`/app` or below).
      env: environment variables set by `ENV`, in order.
      copies: `(host source path, sandbox destination path)` files and directories to copy into
        `/app` at trial start (from `COPY` / `ADD`), with the optional octal `--chmod` mode.
      mkdirs: directories to create under `/app` at trial start.
      notes: ignored instructions, for `list` output.
    """

    profile: str
    base_image: str
    workdir: str = SANDBOX_WORKDIR
    env: tuple = ()
    copies: tuple = ()
    mkdirs: tuple = ()
    notes: tuple = ()


class _Blocked(Exception):
    """One instruction (or one command of a RUN chain) the local sandbox cannot honour; `_Reader`
    records it and reads on, so a refused task lists every blocker at once."""


class _Reader:
    def __init__(self, context: Path, where: str):
        self.context = context
        self.where = where
        self.variables = {"PATH": SANDBOX_PATH, "HOME": "/home/agent"}
        self.env: list[tuple[str, str]] = []
        self.workdir: Optional[str] = None
        self.copies: list[tuple[str, str, Optional[int]]] = []
        self.mkdirs: list[str] = []
        self.notes: list[str] = []
        self.apt: list[str] = []
        self.pip: list[str] = []
        self.image: Optional[str] = None
        self.blockers: list[str] = []  # "line N: `instr`: why", in Dockerfile order

    def fail(self, lineno: int, instr: str, why: str):
        """Records a blocker and abandons the current instruction (or RUN command) by raising `_Blocked`."""
        self.blockers.append(f"line {lineno}: `{instr}`: {why}")
        raise _Blocked()

    def in_workdir(self, lineno, instr, path: str) -> str:
        base = self.workdir or SANDBOX_WORKDIR
        p = posixpath.normpath(posixpath.join(base, path))
        if not (p == SANDBOX_WORKDIR or p.startswith(SANDBOX_WORKDIR + "/")):
            self.fail(lineno, instr, f"{p} is outside {SANDBOX_WORKDIR}, the sandbox's only writable work directory")
        return p

    def run(self, lineno: int, instr: str, args: str):
        argv = exec_form(args)
        if argv is not None:
            if len(argv) >= 3 and argv[0] in ("sh", "/bin/sh", "bash", "/bin/bash") and argv[1] == "-c":
                args = argv[2]
            else:
                args = shlex.join(argv)
        if "<<" in args:
            self.fail(lineno, instr, "heredocs in RUN are not supported by the local sandbox")
        for part in _split_chain(_expand(args, self.variables)):
            try:
                try:
                    argv = shlex.split(part)
                except ValueError as e:
                    self.fail(lineno, instr, f"cannot parse `{part}` ({e})")
                self.run_one(lineno, instr, argv, part)
            except _Blocked:
                continue  # recorded; the chain's other commands are read too

    def run_one(self, lineno, instr, argv: list[str], part: str):
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):  # DEBIAN_FRONTEND=noninteractive apt-get
            argv = argv[1:]
        if not argv or argv[0] in ("true", ":", "[", "test"):
            return  # no-ops, and tests (`[ -e /usr/bin/python ]`), which change nothing
        prog = posixpath.basename(argv[0])
        if prog in ("apt-get", "apt"):
            opts_with_arg = {"-o"}
            skip = False
            words = []
            for a in argv[1:]:
                if skip:
                    skip = False
                    continue
                if a in opts_with_arg:
                    skip = True
                    continue
                if not a.startswith("-"):
                    words.append(a)
            if not words:
                self.fail(lineno, instr, f"`{part}`: no apt subcommand")
            if words[0] in ("update", "upgrade", "clean", "autoclean", "autoremove", "dist-upgrade"):
                return
            if words[0] == "install":
                self.apt.extend((lineno, p) for p in words[1:])
                return
            self.fail(lineno, instr, f"`{part}`: apt subcommand `{words[0]}` is not supported by the local sandbox")
        if prog in ("pip", "pip3") or (prog.startswith("python") and argv[1:3] == ["-m", "pip"]):
            rest = argv[1:] if prog.startswith("pip") else argv[3:]
            if not rest or rest[0] != "install":
                self.fail(lineno, instr, f"`{part}`: only `pip install` is supported by the local sandbox")
            for a in rest[1:]:
                if a in ("-r", "--requirement", "-e", "--editable", "-i", "--index-url", "--extra-index-url"):
                    self.fail(lineno, instr, f"`{part}`: pip option {a} is not supported by the local sandbox "
                                             "(list the packages explicitly)")
                if a.startswith("-"):
                    continue
                name = re.split(r"[<>=!~\[; ]", a, maxsplit=1)[0].strip().lower()
                if not name or "/" in name or name.endswith((".whl", ".tar.gz", ".zip")):
                    self.fail(lineno, instr, f"`{part}`: pip package `{a}` is not supported (only names from PyPI)")
                self.pip.append((lineno, name))
            return
        if prog == "rm" and all(a.startswith("-") or a.startswith(("/var/lib/apt/lists", "/var/cache/apt",
                                                                   "/tmp/", "/root/.cache"))
                                for a in argv[1:]):
            return
        if prog == "mkdir":
            for a in argv[1:]:
                if a.startswith("-"):
                    continue
                p = posixpath.normpath(posixpath.join(self.workdir or "/", a))
                if any(p == o or p.startswith(o + "/") for o in _SANDBOX_OWNED):
                    continue
                self.mkdirs.append(self.in_workdir(lineno, instr, p))
            return
        if prog == "ln" and argv[-1].rstrip("/").endswith("/python") and "python3" in argv[-2]:
            return  # python -> python3: the sandbox PATH already has `python`
        self.fail(lineno, instr, f"command `{prog}` (in `{part}`) is not supported by the local sandbox "
                                 "(RUN may only apt-get/pip install provided packages, mkdir -p under /app, "
                                 "or clean apt caches)")

    def copy(self, lineno: int, instr: str, args: str, is_add: bool):
        # flags come first (`COPY --chmod=755 ["a b", "/app/"]`), then the exec or shell form
        rest = args.strip()
        flags = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.lstrip()
        argv = exec_form(rest)
        if argv is None:
            try:
                argv = shlex.split(rest)
            except ValueError as e:
                self.fail(lineno, instr, f"cannot parse ({e})")
        mode = None
        for f in flags:
            if f.startswith("--chmod="):
                try:
                    mode = int(f.split("=", 1)[1], 8)
                except ValueError:
                    self.fail(lineno, instr, f"bad {f}")
            elif f.startswith(("--chown=", "--link")):
                continue
            else:
                self.fail(lineno, instr, f"flag {f.split('=')[0]} is not supported by the local sandbox")
        if len(argv) < 2:
            self.fail(lineno, instr, "needs a source and a destination")
        *srcs, dest = [_expand(a, self.variables) for a in argv]
        dest_abs = self.in_workdir(lineno, instr, dest)
        ctx = os.path.realpath(self.context)
        for s in srcs:
            if "://" in s:
                self.fail(lineno, instr, f"remote source {s} is not supported (no network at build time)")
            if is_add and re.search(r"\.(tar|tgz|tar\.gz|tar\.bz2|tar\.xz|zip)$", s):
                self.fail(lineno, instr, f"ADD of archive {s} is not supported by the local sandbox (unpack it in the context)")
            matches = sorted(glob.glob(os.path.join(ctx, s))) if any(c in s for c in "*?[") else [os.path.join(ctx, s)]
            if not matches or not all(os.path.exists(m) for m in matches):
                self.fail(lineno, instr, f"source {s} does not exist in the build context")
            for m in matches:
                real = os.path.realpath(m)
                if not _under(real, ctx):
                    self.fail(lineno, instr, f"source {s} is outside the build context")
                if real == ctx or os.path.isdir(real):
                    target = dest_abs
                elif dest.endswith("/") or len(srcs) > 1 or len(matches) > 1:
                    target = posixpath.join(dest_abs, os.path.basename(real))
                else:
                    target = dest_abs
                if real == ctx:
                    # `COPY . /app`: the context minus the Dockerfile
                    for n in sorted(os.listdir(ctx)):
                        if n not in ("Dockerfile", ".dockerignore"):
                            self.copies.append((os.path.join(ctx, n), posixpath.join(target, n), mode))
                else:
                    self.copies.append((real, target, mode))


def resolve_environment(env_dir: str | os.PathLike, docker_image: Optional[str] = None, *,
                        where: str = "environment", python: Optional[str] = None) -> EnvironmentSpec:
    """Reads a task's `environment/` and picks the profile that can stand in for it.

    Args:
      env_dir: the task's build context.
      docker_image: `[environment] docker_image` from task.toml (a prebuilt image; used when there is
        no Dockerfile).
      where: label for error messages.
      python: the Python for the `python` profile (default: `find_python()` order).

    Raises:
      UnsupportedEnvironmentError: no Dockerfile / image, an unsupported instruction, command or package, or no
        profile for the image; the message names every blocker at once (each with its line and
        instruction; every command of a RUN chain is read), then the package or profile problem.
    """
    env_dir = Path(env_dir)
    rd = _Reader(env_dir, where)
    dockerfile = env_dir / "Dockerfile"
    if dockerfile.is_file():
        for lineno, line in _dockerfile_lines(dockerfile.read_text(encoding="utf-8")):
            if line.lstrip().startswith("#"):
                continue
            instr, _, args = line.strip().partition(" ")
            op = instr.upper()
            shown = f"{op} {args.strip()}"[:120]
            try:
                if op == "FROM":
                    if rd.image is not None:
                        rd.fail(lineno, shown, "multi-stage builds are not supported by the local sandbox")
                    words = [w for w in args.split() if not w.startswith("--")]
                    if not words:
                        rd.fail(lineno, shown, "FROM needs an image")
                    rd.image = _expand(words[0], rd.variables)
                elif rd.image is None and op != "ARG":
                    rd.fail(lineno, shown, "instruction before FROM")
                elif op == "RUN":
                    rd.run(lineno, shown, args)
                elif op == "WORKDIR":
                    p = posixpath.normpath(posixpath.join(rd.workdir or "/", _expand(args.strip().strip('"'), rd.variables)))
                    rd.workdir = rd.in_workdir(lineno, shown, p)
                    rd.mkdirs.append(rd.workdir)
                elif op in ("ENV", "ARG"):
                    try:
                        words = shlex.split(args)
                    except ValueError as e:
                        rd.fail(lineno, shown, f"cannot parse ({e})")
                    if op == "ENV" and len(words) >= 2 and "=" not in words[0]:
                        pairs = [(words[0], " ".join(words[1:]))]  # legacy `ENV KEY value with spaces`
                    else:
                        pairs = []
                        for w in words:
                            k, eq, v = w.partition("=")
                            if not eq:
                                if op == "ARG":
                                    continue  # ARG without default: nothing to define
                                rd.fail(lineno, shown, f"expected KEY=VALUE, got {w!r}")
                            pairs.append((k, v))
                    for k, v in pairs:
                        v = _expand(v, rd.variables)
                        rd.variables[k] = v
                        if op == "ENV":
                            rd.env.append((k, v))
                elif op in ("COPY", "ADD"):
                    rd.copy(lineno, shown, args, op == "ADD")
                elif op == "USER":
                    if args.strip() not in ("root", "0", "root:root", "0:0"):
                        rd.fail(lineno, shown, "the sandbox runs every task as one unprivileged user; only `USER root` "
                                               "(a no-op) is accepted")
                    rd.notes.append(f"line {lineno}: {shown} (ignored)")
                elif op == "SHELL":
                    argv = exec_form(args)
                    if argv is None:
                        rd.fail(lineno, shown, "SHELL takes only the JSON form, e.g. SHELL [\"/bin/bash\", \"-c\"]")
                    if not (len(argv) >= 2 and posixpath.basename(argv[0]) in ("sh", "bash") and argv[-1] == "-c"):
                        rd.fail(lineno, shown, "the SHELL instruction is not supported by the local sandbox except "
                                               "sh or bash ending in -c (RUN lines are read as shell commands)")
                    rd.notes.append(f"line {lineno}: {shown} (RUN lines are read as {argv[0]} commands)")
                elif op in ("LABEL", "MAINTAINER", "CMD", "ENTRYPOINT", "EXPOSE", "HEALTHCHECK", "STOPSIGNAL", "VOLUME"):
                    rd.notes.append(f"line {lineno}: {op} (ignored)")
                else:
                    rd.fail(lineno, shown, f"the {op} instruction is not supported by the local sandbox")
            except _Blocked:
                continue  # recorded in rd.blockers; read on
        if rd.image is None:
            _refuse(where, rd.blockers, "no FROM instruction", f"{where}/Dockerfile: no FROM instruction")
    elif docker_image:
        rd.image = docker_image
    elif (env_dir / "docker-compose.yaml").exists() or (env_dir / "docker-compose.yml").exists():
        raise UnsupportedEnvironmentError(f"{where}: docker-compose environments (several services) are not supported by "
                                "the local sandbox; only single-Dockerfile tasks are")
    else:
        raise UnsupportedEnvironmentError(f"{where}: no Dockerfile (and no [environment] docker_image in task.toml)")
    return _choose_profile(rd, where, python)


def _host_has(program: str) -> bool:
    return any(os.path.exists(os.path.join(d, program)) for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"))


def _refuse(where: str, blockers: Sequence[str], extra: Optional[str] = None, extra_alone: Optional[str] = None):
    """Raises the one UnsupportedEnvironmentError naming every blocker of a Dockerfile at once.

    Args:
      where: label of the task's environment for the message.
      blockers: "line N: `instr`: why" items, in Dockerfile order.
      extra: a further problem (no FROM, no profile for the image or its packages), listed last.
      extra_alone: the message to raise when `extra` is the only problem.

    Raises:
      UnsupportedEnvironmentError: always. One blocker reads "WHERE/Dockerfile line N: `instr`: why";
        several read "WHERE/Dockerfile: K problems for the local sandbox: (1) ...; (2) ...".
    """
    items = list(blockers) + ([extra] if extra else [])
    if len(items) == 1:
        raise UnsupportedEnvironmentError(f"{where}/Dockerfile {blockers[0]}" if blockers else extra_alone)
    raise UnsupportedEnvironmentError(f"{where}/Dockerfile: {len(items)} problems for the local sandbox: "
                                      + "; ".join(f"({i}) {b}" for i, b in enumerate(items, 1)))


def _choose_profile(rd: _Reader, where: str, python: Optional[str]) -> EnvironmentSpec:
    image = rd.image
    matching = [p for p in _PROFILES if any(fnmatch.fnmatch(image, pat) for pat in p.base_images)]
    if not matching:
        why = (f"base image {image!r} has no sandbox profile (known images: "
               f"{sorted({b for p in _PROFILES for b in p.base_images})}); register one with "
               "jaxrl.envs.harbor.register_profile")
        _refuse(where, rd.blockers, why, f"{where}: {why}")
    needs_python = bool(rd.pip) or any(p in PYTHON_APT for _, p in rd.apt) or image.startswith("python")
    problems = []
    for prof in matching:
        if needs_python and not prof.python:
            problems.append(f"profile {prof.name!r} has no Python")
            continue
        bad = []
        for lineno, pkg in rd.apt:
            base = pkg.split("=")[0]
            if base in prof.apt_packages or base in APT_NOOP:
                continue
            prog = APT_PROGRAMS.get(base)
            if prog is None:
                bad.append(f"line {lineno}: apt package {base!r} is unknown to the local sandbox")
            elif not _host_has(prog):
                bad.append(f"line {lineno}: apt package {base!r} is not installed on this host "
                           f"(`{prog}` not found; apt-get install {base})")
        if prof.python and rd.pip:
            try:
                rt = find_python(python)
            except UnsupportedEnvironmentError as e:
                if not rd.blockers:
                    raise
                _refuse(where, rd.blockers, str(e))
            mods = tuple(sorted({PIP_IMPORT_NAMES.get(n, n.replace("-", "_")) for _, n in rd.pip}))
            ok = _importable(rt.executable, mods)
            for lineno, n in rd.pip:
                m = PIP_IMPORT_NAMES.get(n, n.replace("-", "_"))
                if not ok.get(m):
                    bad.append(f"line {lineno}: pip package {n!r} cannot be imported by the sandbox Python "
                               f"{rt.executable} (pip install {n} there)")
        if bad:
            problems.extend(f"profile {prof.name!r}: {b}" for b in bad)
            continue
        if rd.blockers:
            _refuse(where, rd.blockers)
        return EnvironmentSpec(profile=prof.name, base_image=image, workdir=rd.workdir or SANDBOX_WORKDIR,
                               env=tuple(rd.env), copies=tuple(rd.copies), mkdirs=tuple(dict.fromkeys(rd.mkdirs)),
                               notes=tuple(rd.notes))
    why = "no sandbox profile provides this environment: " + "; ".join(problems)
    _refuse(where, rd.blockers, why, f"{where}/Dockerfile: {why}")
