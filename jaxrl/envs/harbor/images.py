"""The image backend: build a task's own `environment/Dockerfile` and run its trials on the built image.

The profile path (`profiles.py`) reads a Dockerfile against what the host provides; this module builds
it instead, with a real builder, and runs every trial in a fresh writable container of the built image:

    cache = ImageCache(ImageCacheConfig(base_images={"ubuntu:24.04": "localhost/debian-stand-in:bookworm"}))
    ref = cache.ensure(task)                      # builds once per build context, then reuses the image
    sb = ImageSandbox(trial_dir, task.environment, limits, SandboxConfig(), cache=cache)

* Builders: `Builder` is the small interface (build, tag, image id/size/config, rmi, per-trial containers).
  `BuildahBuilder` (`buildah bud --isolation chroot`, `buildah from` + `buildah mount` per trial) is the one
  verified here. Docker, Podman and Apptainer are not implemented or verified: they would be other
  `Builder` subclasses.
* The image tag is `localhost/jaxrl-task:<16 hex>` of `context_hash`: the build context's sorted relative
  paths, modes, contents and symlink targets, the base-image map and the builder's name. Equal contexts
  share one image; any changed file gives another.
* Base images are never pulled unless configured (`pull=True`): each `FROM` name (and task.toml's
  `[environment] docker_image`) found in `base_images` is tagged from its local image before the build.
* `ImageCache` keeps an index (`index.json`, written atomically under a file lock) of the images it built
  with their size and last use, builds at most `build_concurrency` images at once (file locks, shared by
  every process using the same cache directory), and after each build removes the least recently used
  images not in use by a container until the total is under `max_mb`.
* A failed build raises `ImageBuildError`: one line naming the task, the failing step, the builder's last
  error line and the log file holding the full output.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import sys
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.profiles import EnvironmentSpec
from jaxrl.envs.harbor.fsutil import disk_usage
from jaxrl.envs.harbor.profile_dir import _profile_dir
from jaxrl.envs.harbor.sandbox import Sandbox
from jaxrl.envs.harbor.sandbox_config import Limits, SandboxConfig
from jaxrl.fileio import atomic_write_text

log = logging.getLogger(__name__)

IMAGE_PROFILE = "image"
"""`EnvironmentSpec.profile` of tasks whose environment is built (the image backend)."""
TAG_REPO = "localhost/jaxrl-task"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
BACKENDS = ("profile", "image", "auto")


class ImageBuildError(SandboxError):
    """A task's image could not be built (or its base image is missing); the message says which step and the fix."""


# ---------------------------------------------------------------------------------------------
# Hashing and Dockerfile FROM names


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def context_hash(env_dir: str | os.PathLike, base_images: Optional[dict] = None, builder: str = "buildah",
                 docker_image: Optional[str] = None, base_ids: Optional[dict] = None) -> str:
    """The sha256 (hex) identifying one build: the context's files and the settings that change the image.

    Args:
      env_dir: the build context (the task's `environment/`).
      base_images: the `{FROM name: local image}` map in force.
      builder: the builder's name.
      docker_image: task.toml's `[environment] docker_image`, if any.
      base_ids: `{FROM name: image id}` of the local images the build starts from, so a base rebuilt
        under the same name (a new stand-in) gives new task images instead of stale ones.

    Returns:
      64 hex digits over the sorted relative paths, each entry's type and permission bits, file contents,
      symlink targets (never followed), the sorted base-image map and base ids, the builder name and
      docker_image.

    Raises:
      OSError: the context cannot be read.
    """
    root = os.fspath(env_dir)
    h = hashlib.sha256()
    h.update(f"builder={builder}\0docker_image={docker_image or ''}\0".encode())
    for k, v in sorted((base_images or {}).items()):
        h.update(f"base={k}={v}\0".encode())
    for k, v in sorted((base_ids or {}).items()):
        h.update(f"base_id={k}={v}\0".encode())
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in dirnames + filenames:
            entries.append(os.path.join(dirpath, n))
    for p in sorted(entries, key=lambda p: os.path.relpath(p, root)):
        rel = os.path.relpath(p, root)
        st = os.lstat(p)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            body = "link:" + os.readlink(p)
        elif stat.S_ISDIR(st.st_mode):
            body = "dir"
        elif stat.S_ISREG(st.st_mode):
            body = "file:" + _file_digest(p)
        else:
            body = "special"
        h.update(f"{rel}\0{mode:o}\0{body}\0".encode())
    return h.hexdigest()


def image_tag(digest: str) -> str:
    """`localhost/jaxrl-task:<first 16 hex digits>` of a `context_hash`."""
    return f"{TAG_REPO}:{digest[:16]}"


def dockerfile_bases(text: str) -> list[str]:
    """The external images a Dockerfile's `FROM` lines name (stage aliases excluded, `ARG` defaults expanded)."""
    return _scan_images(re.sub(r"\\\r?\n", " ", text), {})[2]


def qualified(name: str) -> str:
    """A short image name as the Docker Hub default would qualify it: `ubuntu:24.04` ->
    `docker.io/library/ubuntu:24.04`, `org/x` -> `docker.io/org/x`; names with a registry are kept."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def rewrite_bases(text: str, mapping: dict) -> tuple[str, list[str]]:
    """The Dockerfile with each mapped external image replaced by its local image, and the external
    images it still names.

    `FROM name` (also `FROM ${ARG}` with an ARG default before the first FROM) and `COPY --from=name`
    whose name (or its docker.io-qualified form) is a key of `mapping` get the mapped local image, so
    a build never retags a shared name in the image store; stage names and `scratch` are kept.

    Returns:
      (new text, [external image names not mapped, in order]).
    """
    new, unmapped, _ = _scan_images(text, mapping)
    return new, unmapped


def _scan_images(text: str, mapping: dict) -> tuple[str, list[str], list[str]]:
    """One pass over a Dockerfile's lines for `rewrite_bases` and `dockerfile_bases`: (the text with
    mapped images replaced, the external images not mapped, the external images of FROM lines)."""
    args: dict = {}
    stages: set = set()
    unmapped: list = []
    bases: list = []
    seen_from = False

    def expand(word: str) -> str:
        return re.sub(r"\$\{?(\w+)(?::-([^}]*))?\}?", lambda m: args.get(m.group(1), m.group(2) or ""), word)

    def local(name: str) -> Optional[str]:
        return mapping.get(name) or mapping.get(qualified(name))

    out = []
    for line in text.splitlines(keepends=True):
        op, _, rest = line.strip().partition(" ")
        op = op.upper()
        if op == "ARG" and not seen_from:
            k, eq, v = rest.strip().partition("=")
            if eq:
                args[k.strip()] = v.strip().strip('"')
        elif op == "FROM":
            seen_from = True
            words = rest.split()
            i = next((j for j, w in enumerate(words) if not w.startswith("--")), None)
            if i is not None:
                name = expand(words[i])
                alias = words[i + 2].lower() if len(words) > i + 2 and words[i + 1].lower() == "as" else None
                if name.lower() not in stages and name != "scratch":
                    if name not in bases:
                        bases.append(name)
                    if local(name):
                        words[i] = local(name)
                        line = line[:len(line) - len(line.lstrip())] + "FROM " + " ".join(words) + "\n"
                    elif name not in unmapped:
                        unmapped.append(name)
                if alias:
                    stages.add(alias)
        elif op in ("COPY", "ADD"):
            m = re.search(r"--from=(\S+)", line)
            if m:
                name = expand(m.group(1))
                if name.lower() not in stages and not name.isdigit():
                    if local(name):
                        line = line[:m.start(1)] + local(name) + line[m.end(1):]
                    elif name not in unmapped:
                        unmapped.append(name)
        out.append(line)
    return "".join(out), unmapped, bases


# ---------------------------------------------------------------------------------------------
# Builders


class Builder:
    """What the image backend needs from a container tool. Subclasses: `BuildahBuilder` (verified);
    Docker, Podman and Apptainer would be further subclasses (not written or verified)."""

    name = "builder"

    def available(self) -> Optional[str]:
        """Why this builder cannot run here (None when it can)."""
        raise NotImplementedError

    def image_id(self, ref: str) -> Optional[str]:
        """The full id of a local image, or None when there is none."""
        raise NotImplementedError

    def tag(self, src: str, dst: str) -> None:
        raise NotImplementedError

    def build(self, context: str, tag: str, log_path: str, *, pull: bool, timeout: float) -> None:
        """Builds `context/Dockerfile` as `tag`, writing the full output to `log_path`.

        Raises:
          ImageBuildError: without the task name (`ImageCache.ensure` adds it).
        """
        raise NotImplementedError

    def image_size(self, ref: str) -> int:
        raise NotImplementedError

    def image_config(self, ref: str) -> dict:
        """`{"workdir": str, "env": [(k, v)...], "user": str}` of an image."""
        raise NotImplementedError

    def remove_image(self, ref: str) -> bool:
        raise NotImplementedError

    def images_in_use(self) -> set:
        """Ids of the images some container is based on."""
        raise NotImplementedError

    def create_container(self, ref: str) -> tuple[str, str]:
        """A new writable container of `ref`, mounted: (container id, host path of its root)."""
        raise NotImplementedError

    def writable_layer(self, container: str, mountpoint: str) -> str:
        """The host directory holding what the container wrote (its upper layer)."""
        raise NotImplementedError

    def remove_container(self, container: str) -> None:
        raise NotImplementedError


_UNITS = {"b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


class BuildahBuilder(Builder):
    """buildah with `--isolation chroot` (no daemon, no runtime; works as root inside this machine's container).

    Args:
      buildah: the buildah executable.
      volumes: extra `-v` specs for every RUN step (the host CA bundle is added when it exists).
    """

    name = "buildah"

    def __init__(self, buildah: str = "buildah", volumes: Sequence[str] = ()):
        self.exe = buildah
        self.volumes = list(volumes)
        self.builds = 0  # successful builds by this builder (tests read it)

    def _run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise SandboxError(f"{self.exe} is not installed: apt-get install buildah (the image backend's builder)") from None
        except subprocess.TimeoutExpired:
            raise SandboxError(f"`buildah {' '.join(args[:2])}` took longer than {timeout:g} s") from None
        if check and r.returncode != 0:
            raise SandboxError(f"`buildah {' '.join(args)}` failed: {(r.stderr or r.stdout).strip()[-500:]}")
        return r

    def available(self) -> Optional[str]:
        if shutil.which(self.exe) is None:
            return f"{self.exe} not found: apt-get install buildah (harbor.environment_backend='image' builds with it)"
        return None

    def image_id(self, ref: str) -> Optional[str]:
        r = self._run("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref, check=False)
        return r.stdout.strip() or None if r.returncode == 0 else None

    def tag(self, src: str, dst: str) -> None:
        self._run("tag", src, dst)

    def build(self, context: str, tag: str, log_path: str, *, pull: bool, timeout: float,
              dockerfile: Optional[str] = None) -> None:
        argv = [self.exe, "bud", "--isolation", "chroot", "--pull=true" if pull else "--pull=never", "--layers=false",
                "-t", tag, "-f", dockerfile or os.path.join(context, "Dockerfile")]
        if os.path.isfile(HOST_CA):
            # pip in RUN steps verifies against the host's CA bundle. buildah 1.28's --env reaches only the
            # committed image (and --unsetenv hides it from RUN too), so a pip config file bound for the build
            # names it; neither file stays in the image (an empty /etc/xdg/pip directory does).
            conf = os.path.join(os.path.dirname(log_path), "pip-host-ca.conf")
            if not os.path.isfile(conf):
                atomic_write_text(conf, "[global]\ncert = /run/host-ca.crt\n")
            # uv (its own TLS roots by default) is told to use the image's trust store, which on a machine whose
            # egress TLS is intercepted must hold the host's CA (the stand-ins of launch/make_base_stand_ins.sh do).
            uvconf = os.path.join(os.path.dirname(log_path), "uv-native-tls.toml")
            if not os.path.isfile(uvconf):
                atomic_write_text(uvconf, "native-tls = true\n")
            argv += ["-v", f"{HOST_CA}:/run/host-ca.crt:ro", "-v", f"{conf}:/etc/xdg/pip/pip.conf:ro",
                     "-v", f"{uvconf}:/etc/uv/uv.toml:ro"]
        for v in self.volumes:
            argv += ["-v", v]
        argv.append(context)
        tmp = log_path + ".part"
        with open(tmp, "w") as logf:
            logf.write("$ " + shlex.join(argv) + "\n")
            logf.flush()
            try:
                r = subprocess.run(argv, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout)
                code = r.returncode
            except subprocess.TimeoutExpired:
                code = None
        os.replace(tmp, log_path)
        if code == 0:
            self.builds += 1
            return
        text = Path(log_path).read_text(errors="replace")
        steps = re.findall(r"^STEP \d+/\d+: .*$", text, flags=re.M)
        step = steps[-1][:160] if steps else "before the first step"
        errs = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("STEP ", "$ "))]
        last = next((ln for ln in reversed(errs) if re.search(r"error|fail|not found|unable", ln, re.I)),
                    errs[-1] if errs else "")
        if code is None:
            raise ImageBuildError(f"the build ran longer than build_timeout_sec={timeout:g} s at {step}; raise "
                                  f"[environment] build_timeout_sec or shorten that step (log: {log_path})")
        raise ImageBuildError(f"the build failed at {step}: {last.strip()[:300]}; fix that Dockerfile step, or map "
                              f"a missing base image in harbor.base_images (log: {log_path})")

    def image_size(self, ref: str) -> int:
        r = self._run("images", "--json", ref, check=False)
        try:
            size = json.loads(r.stdout)[0]["size"]
        except (ValueError, IndexError, KeyError, TypeError):
            return 0
        m = re.match(r"([\d.]+)\s*([kKmMgGtT]?B)", str(size))
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()]) if m else 0

    def image_config(self, ref: str) -> dict:
        r = self._run("inspect", "--type", "image", ref)
        cfg = (json.loads(r.stdout).get("OCIv1") or {}).get("config") or {}
        env = []
        for kv in cfg.get("Env") or []:
            k, _, v = kv.partition("=")
            env.append((k, v))
        return {"workdir": cfg.get("WorkingDir") or "/", "env": env, "user": cfg.get("User") or ""}

    def remove_image(self, ref: str) -> bool:
        return self._run("rmi", ref, check=False).returncode == 0

    def images_in_use(self) -> set:
        r = self._run("containers", "--all", "--json", check=False)
        try:
            return {c.get("imageid", "") for c in json.loads(r.stdout or "[]") or []}
        except ValueError:
            return set()

    def create_container(self, ref: str) -> tuple[str, str]:
        self.remove_stale_containers()
        name = f"{CONTAINER_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        c = self._run("from", "--pull=never", "-q", "--name", name, ref).stdout.strip()
        try:
            m = self._run("mount", c).stdout.strip()
        except SandboxError:
            self.remove_container(c)
            raise
        return c, m

    def writable_layer(self, container: str, mountpoint: str) -> str:
        upper = os.path.join(os.path.dirname(mountpoint), "diff")
        if os.path.basename(mountpoint) == "merged" and os.path.isdir(upper):
            return upper  # the overlay driver: <layer>/merged over <layer>/diff
        return mountpoint  # vfs: the whole copy

    def remove_container(self, container: str) -> None:
        self._run("rm", container, check=False)

    def remove_stale_containers(self) -> list[str]:
        """Removes the trial containers of processes that no longer run (a trial process killed by
        SIGKILL or SIGTERM leaves its container and writable layer behind; names carry the creator's pid).

        Returns:
          the names removed.
        """
        r = self._run("containers", "--all", "--json", check=False)
        try:
            rows = json.loads(r.stdout or "[]") or []
        except ValueError:
            return []
        removed = []
        for row in rows:
            name = row.get("containername", "")
            m = re.fullmatch(re.escape(CONTAINER_PREFIX) + r"(\d+)-[0-9a-f]+", name)
            if m and not _pid_alive(int(m.group(1))):
                self._run("umount", name, check=False)
                if self._run("rm", name, check=False).returncode == 0:
                    removed.append(name)
                    log.info("image cache: removed the container %s of a process that ended", name)
        return removed


CONTAINER_PREFIX = "jaxrl-trial-"
"""Trial containers are named `jaxrl-trial-<pid>-<8 hex>` (their creator's pid)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


BUILDERS = {"buildah": BuildahBuilder}


# ---------------------------------------------------------------------------------------------
# The cache


@dataclasses.dataclass(frozen=True)
class ImageCacheConfig:
    """Settings of the image cache (harbor.base_images / image_cache_max_mb / build_concurrency / image_cache_dir).

    Attributes:
      base_images: `{FROM name or docker_image: local image}`; each is tagged before a build (`ubuntu:24.04`
        also as `docker.io/library/ubuntu:24.04`).
      cache_dir: holds index.json, the build locks and build logs (default ~/.cache/jaxrl/images).
      max_mb: total size of the built images kept; least recently used ones not in use are removed above it.
      build_concurrency: builds at once (per cache directory, across processes).
      pull: let the builder pull missing base images (off: only local images are used).
      builder: "buildah" (the only one implemented).
    """

    base_images: tuple = ()
    cache_dir: Optional[str] = None
    max_mb: int = 20480
    build_concurrency: int = 1
    pull: bool = False
    builder: str = "buildah"

    def validate(self) -> None:
        """Raises ValueError naming the setting and the fix."""
        if self.builder not in BUILDERS:
            raise ValueError(f"image builder {self.builder!r}: only {sorted(BUILDERS)} is implemented")
        if not isinstance(self.max_mb, int) or self.max_mb <= 0:
            raise ValueError(f"harbor.image_cache_max_mb={self.max_mb!r}: a positive number of megabytes")
        if not isinstance(self.build_concurrency, int) or self.build_concurrency < 1:
            raise ValueError(f"harbor.build_concurrency={self.build_concurrency!r}: a positive integer (1 fits 2 cores)")
        for pair in self.base_images:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) and s for s in pair)):
                raise ValueError(f"harbor.base_images entry {pair!r}: map image names to local images, "
                                 "e.g. 'ubuntu:24.04=localhost/debian-stand-in:bookworm'")

    @property
    def base_map(self) -> dict:
        return dict(self.base_images)

    @property
    def dir(self) -> Path:
        return Path(self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "jaxrl", "images"))


class ImageCache:
    """Builds task images once per build context and keeps them within a size cap (module docstring).

    Args:
      config: the cache settings.
      builder: the builder (default: `config.builder`'s class).
    """

    def __init__(self, config: ImageCacheConfig = ImageCacheConfig(), builder: Optional[Builder] = None):
        config.validate()
        self.config = config
        self.builder = builder or BUILDERS[config.builder]()
        self.dir = config.dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self._in_use: dict = {}  # tag -> count of this process's live containers
        self._lock = threading.Lock()

    # -- index -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _index(self):
        """The index, locked across processes; changes to the yielded dict are written back atomically."""
        with open(self.dir / "index.lock", "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                p = self.dir / "index.json"
                try:
                    idx = json.loads(p.read_text())
                    if not isinstance(idx, dict):
                        idx = {}
                except (OSError, ValueError):
                    idx = {}
                before = json.dumps(idx, sort_keys=True)
                yield idx
                if json.dumps(idx, sort_keys=True) != before:
                    atomic_write_text(str(p), json.dumps(idx, indent=1, sort_keys=True))
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)

    def index(self) -> dict:
        """A copy of the index: `{tag: {"task", "size", "last_used", "image_id"}}`."""
        with self._index() as idx:
            return json.loads(json.dumps(idx))

    def _touch(self, tag: str, **fields) -> None:
        with self._index() as idx:
            e = idx.setdefault(tag, {})
            e.update(fields)
            e["last_used"] = time.time()

    @contextlib.contextmanager
    def _build_slot(self):
        n = self.config.build_concurrency
        files = [open(self.dir / f"build-{i}.lock", "a") for i in range(n)]
        try:
            while True:
                for f in files:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    try:
                        yield
                    finally:
                        fcntl.flock(f, fcntl.LOCK_UN)
                    return
                time.sleep(0.2)
        finally:
            for f in files:
                f.close()

    # -- public ------------------------------------------------------------------------------
    def tag_for(self, task, context: Optional[Path] = None) -> str:
        """The image tag of `task`'s build context (default its `environment/`; no build)."""
        env_dir = Path(context) if context is not None else Path(task.path) / "environment"
        return image_tag(context_hash(env_dir, self.config.base_map, self.builder.name, task.config.docker_image,
                                      self._base_ids(env_dir)))

    def _base_ids(self, env_dir: Path) -> dict:
        """`{FROM name: image id}` of each base the Dockerfile names that is a local image (mapped or not);
        stage names and bases not yet present are left out."""
        dockerfile = env_dir / "Dockerfile"
        if not dockerfile.is_file():
            return {}
        bases = self.config.base_map
        out = {}
        for name in dockerfile_bases(dockerfile.read_text(encoding="utf-8", errors="replace")):
            local = bases.get(name) or bases.get(qualified(name)) or name
            image_id = self.builder.image_id(local)
            if image_id:
                out[name] = image_id
        return out

    def ensure(self, task, context: Optional[Path] = None) -> str:
        """The local image of `task`'s environment, built if this context has no image yet.

        Args:
          task: a `HarborTask` (its `environment/` is the build context; `[environment] docker_image`
            without a Dockerfile names a prebuilt image, mapped through base_images like a FROM name).
          context: another build context of the task with its own Dockerfile (a separate verifier's
            `tests/`); default `environment/`.

        Returns:
          the image reference to create containers from.

        Raises:
          ImageBuildError: naming the task, the failing step and the fix (the log file keeps the output).
        """
        why = self.builder.available()
        if why:
            raise ImageBuildError(f"task {task.name}: {why}")
        env_dir = Path(context) if context is not None else Path(task.path) / "environment"
        what = f"task {task.name}" + (f" ({env_dir.name}/Dockerfile)" if context is not None else "")
        dockerfile = env_dir / "Dockerfile"
        if not dockerfile.is_file():
            return self._prebuilt(task)
        tag = self.tag_for(task, env_dir)
        if self.builder.image_id(tag):
            self._touch(tag, task=task.name)
            return tag
        with self._build_slot():
            if self.builder.image_id(tag):  # another process built it while we waited
                self._touch(tag, task=task.name)
                return tag
            text = self._map_bases(task, dockerfile.read_text(encoding="utf-8", errors="replace"))
            log_path = str(self.dir / "logs" / f"{tag.rsplit(':', 1)[1]}.log")
            mapped = self.dir / "logs" / f"{tag.rsplit(':', 1)[1]}.Dockerfile"  # FROM names -> local images
            atomic_write_text(str(mapped), text)
            t0 = time.monotonic()
            print(f"jaxrl: building the image of {what} ({tag}; log {log_path})", file=sys.stderr,
                  flush=True)
            try:
                self.builder.build(str(env_dir), tag, log_path, pull=self.config.pull,
                                   timeout=float(task.config.build_timeout_sec), dockerfile=str(mapped))
            except ImageBuildError as e:
                raise ImageBuildError(f"{what}: {e}") from None
            log.info("%s: built %s in %.1f s", what, tag, time.monotonic() - t0)
        self._touch(tag, task=task.name, size=self.builder.image_size(tag), image_id=self.builder.image_id(tag))
        self.evict(keep=(tag,))
        return tag

    def _prebuilt(self, task) -> str:
        name = task.config.docker_image
        if not name:
            raise ImageBuildError(f"task {task.name}: environment/ has no Dockerfile and task.toml no "
                                  "[environment] docker_image; add one of them")
        local = self.config.base_map.get(name)
        ref = local or name
        if not self.builder.image_id(ref):
            raise ImageBuildError(f"task {task.name}: [environment] docker_image {name!r} is not a local image and "
                                  f"images are not pulled; map it in harbor.base_images (--base-image), e.g. "
                                  f"'{name}=localhost/debian-stand-in:bookworm' (docs/terminal_tasks.md)")
        return ref

    def _map_bases(self, task, text: str) -> str:
        """The Dockerfile text to build: mapped base images (FROM, COPY --from) replaced by their local
        images (`rewrite_bases`; nothing in the image store is retagged), every image checked first.

        Raises:
          ImageBuildError: a mapped local image that does not exist, or (images not pulled) an unmapped
            image with no local copy, naming the task, the image and the fix.
        """
        bases = self.config.base_map
        for name in dockerfile_bases(text):
            local = bases.get(name) or bases.get(qualified(name))
            if local and not self.builder.image_id(local):
                raise ImageBuildError(f"task {task.name}: harbor.base_images maps {name} to {local!r}, which is not a "
                                      "local image; build it first (docs/terminal_tasks.md, 'A local base image')")
        new, unmapped = rewrite_bases(text, bases)
        for name in unmapped:
            if not self.config.pull and not (self.builder.image_id(name) or self.builder.image_id(qualified(name))):
                raise ImageBuildError(f"task {task.name}: image {name} (FROM or COPY --from): no local image of that "
                                      f"name and images are not pulled; map it in harbor.base_images (--base-image), "
                                      f"e.g. '{name}=localhost/debian-stand-in:bookworm' (docs/terminal_tasks.md, "
                                      "'A local base image')")
        return new

    def acquire(self, tag: str) -> None:
        """Marks `tag` in use by this process (never evicted until `release`)."""
        with self._lock:
            self._in_use[tag] = self._in_use.get(tag, 0) + 1
        self._touch(tag)

    def release(self, tag: str) -> None:
        with self._lock:
            n = self._in_use.get(tag, 0) - 1
            if n > 0:
                self._in_use[tag] = n
            else:
                self._in_use.pop(tag, None)

    def evict(self, keep: Sequence[str] = ()) -> list[str]:
        """Removes least recently used cached images until their total size is at most `max_mb`.

        Images in `keep`, used by a live container of this process or of any container the builder
        knows, are never removed.

        Returns:
          the tags removed.
        """
        removed = []
        cap = self.config.max_mb * 10 ** 6
        in_use_ids = self.builder.images_in_use()
        with self._lock:
            protected = set(keep) | set(self._in_use)
        with self._index() as idx:
            for tag in list(idx):
                if not self.builder.image_id(tag):
                    del idx[tag]  # removed behind our back
            total = sum(int(e.get("size", 0)) for e in idx.values())
            for tag in sorted(idx, key=lambda t: idx[t].get("last_used", 0)):
                if total <= cap:
                    break
                e = idx[tag]
                iid = self.builder.image_id(tag) or ""
                if tag in protected or any(i and iid.startswith(i) for i in in_use_ids):
                    continue
                if self.builder.remove_image(tag):
                    total -= int(e.get("size", 0))
                    del idx[tag]
                    removed.append(tag)
                    log.info("image cache: removed %s (%s, least recently used)", tag, e.get("task", "?"))
        return removed


_CACHES: dict = {}
_CACHES_LOCK = threading.Lock()


def image_cache(config: ImageCacheConfig) -> ImageCache:
    """The process-wide `ImageCache` for these settings."""
    with _CACHES_LOCK:
        if config not in _CACHES:
            _CACHES[config] = ImageCache(config)
        return _CACHES[config]


# ---------------------------------------------------------------------------------------------
# The sandbox on a built image


class ImageSandbox(Sandbox):
    """A trial's sandbox whose root is a fresh writable container of the task's built image.

    As the profile sandbox (`Sandbox`): every command runs in a new bwrap instance with all namespaces
    unshared (no network unless the task allows internet and `SandboxConfig.network == "host"`),
    `--disable-userns`, `--cap-drop ALL`, the seccomp filter, the trial cgroup (or rlimits), the
    rlimit prologue, the disk monitor, /logs and the phase binds. Differences: the container's root is
    bound writable at `/` (its writes land in the container's own layer, which is what the disk
    limit measures, with the trial's /tmp and logs); commands run as uid 0 of the user namespace
    (root of the image, no capabilities on the host); the workdir and environment are the image's
    `WORKDIR` / `ENV` (task.toml's `workdir` and `env` on top); `/tmp` is the trial's private directory
    as in the profile path. `close()` removes the container and its layer.

    Args:
      root, environment, limits, config, allow_internet: as `Sandbox`.
      cache: the image cache that builds or finds the image (default: `image_cache(ImageCacheConfig())`).
      task: the `HarborTask` (its environment/ is built); required.
      context: another build context of the task (a separate verifier's `tests/`); default environment/.
    """

    def __init__(self, root, environment: EnvironmentSpec, limits: Limits, config: SandboxConfig = SandboxConfig(),
                 allow_internet: bool = False, *, task=None, cache: Optional[ImageCache] = None,
                 context: Optional[Path] = None):
        if task is None:
            raise SandboxError("ImageSandbox needs the task (its environment/ is the build context)")
        super().__init__(root, environment, limits, config, allow_internet)
        self.task = task
        self.context = context
        self.cache = cache or image_cache(ImageCacheConfig())
        self.dirs = {k: self.root / k for k in ("tmp", "logs/agent", "logs/artifacts", "logs/verifier")}
        self.image: Optional[str] = None
        self.container: Optional[str] = None
        self.rootfs: Optional[str] = None
        self.layer: Optional[str] = None
        self._image_env: list = []

    def prepare(self) -> None:
        """Builds or reuses the image, creates and mounts the trial's container, the trial dirs and the cgroup.

        Raises:
          ImageBuildError: the image cannot be built.
          SandboxError: as `Sandbox.prepare`, or the container cannot be created; `host_uid` is set (root of
            the image must own its files: use cgroups instead).
        """
        if self._unsafe:
            raise SandboxError("the image backend needs bwrap; sandbox.backend='UNSAFE_host_no_isolation' cannot "
                               "run a built image (use harbor.environment_backend='profile')")
        if self.config.host_uid is not None:
            raise SandboxError("sandbox.host_uid cannot be combined with the image backend (the image's files are "
                               "owned by uid 0 of the build); unset host_uid and use cgroup limits")
        if self.root.exists() and any(self.root.iterdir()):
            raise SandboxError(f"trial directory {self.root} is not empty")
        self.image = self.cache.ensure(self.task, self.context)
        self.cache.acquire(self.image)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "logs", 0o755)
        os.chmod(self.dirs["tmp"], 0o1777)
        cfg = self.cache.builder.image_config(self.image)
        self.container, self.rootfs = self.cache.builder.create_container(self.image)
        _LIVE_CONTAINERS[self.container] = self.cache.builder
        self.layer = self.cache.builder.writable_layer(self.container, self.rootfs)
        self._image_env = list(cfg["env"])
        workdir = (self.task.config.workdir if self.context is None else None) or cfg["workdir"] or "/"
        self.environment = dataclasses.replace(self.environment, workdir=workdir)
        self._mkdir_in_rootfs(workdir)
        if self.limits_backend == "cgroup":
            from jaxrl.envs.harbor.cgroups import detect_cgroups

            cg, _ = detect_cgroups(self.config.cgroup_parent)
            self.cgroup = cg.create(self.limits, None)

    def _open_dir_in_rootfs(self, parts: Sequence[str], *, create: bool, what: str) -> int:
        """An fd of the directory `/parts...` of the container root, reached without following any symlink
        (each component opened with O_NOFOLLOW relative to the last); created when `create`."""
        fd = os.open(self.rootfs, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                if part == "..":
                    raise SandboxError(f"{what}: the path must not contain '..'")
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _mkdir_in_rootfs(self, path: str) -> None:
        """Creates `path` inside the container root without following any symlink of the image."""
        try:
            os.close(self._open_dir_in_rootfs([p for p in path.split("/") if p and p != "."], create=True,
                                              what=f"workdir {path!r}"))
        except OSError as e:
            raise SandboxError(f"cannot create the workdir {path} in the image: {e}") from None

    def copy_out(self, path: str, dest: Path) -> list[str]:
        """Copies `path` (a file or directory of the container, absolute) to the host path `dest`.

        Nothing is followed out of the container: every component is opened with O_NOFOLLOW, symlinks
        and special files inside it are skipped (as Harbor's tar `data` filter skips them), and only
        regular files and directories are copied, with their permission bits less setuid/setgid.

        Returns:
          None when `path` does not exist, else the container paths that were skipped (symlinks,
          devices, sockets, FIFOs; `[path]` when `path` itself is one of them).
        """
        parts = [p for p in path.split("/") if p and p != "."]
        if not parts:
            raise SandboxError("copy_out: the path must not be /")
        try:
            dfd = self._open_dir_in_rootfs(parts[:-1], create=False, what=path)
        except OSError:
            return None  # a missing parent, or one that is a symlink or not a directory
        skipped: list[str] = []
        try:
            try:
                os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            _copy_nofollow(dfd, parts[-1], Path(dest), path, skipped)
        finally:
            os.close(dfd)
        return skipped

    def place(self, src: Path, path: str) -> None:
        """Copies the host file or directory `src` to the absolute `path` inside the container, creating
        its parent directories (no symlink of the image is followed; an existing entry is replaced)."""
        parts = [p for p in path.split("/") if p and p != "."]
        if not parts:
            raise SandboxError("place: the path must not be /")
        dfd = self._open_dir_in_rootfs(parts[:-1], create=True, what=path)
        try:
            name = parts[-1]
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if stat.S_ISDIR(st.st_mode):
                    target = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                    os.close(target)
                    shutil.rmtree(name, dir_fd=dfd)
                else:
                    os.unlink(name, dir_fd=dfd)
            _place_nofollow(Path(src), dfd, name)
        finally:
            os.close(dfd)

    def env(self, extra: Optional[dict] = None, terminal: bool = False) -> dict:
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
               "HOSTNAME": "sandbox"}
        env.update(dict(self._image_env))
        if terminal:
            env["TERM"] = "dumb"
        env.update(self.config.mirror_env())
        env.update(dict(self.environment.env))
        env.update(extra or {})
        return env

    def bwrap_argv(self, command: Sequence[str], *, phase_binds: Sequence[tuple[str, str, bool]] = (),
                   env: Optional[dict] = None, cwd: Optional[str] = None, seccomp_fd: Optional[int] = None) -> list[str]:
        """The argv that runs `command` on the trial's container (arguments as `Sandbox.bwrap_argv`)."""
        if self.rootfs is None:
            raise SandboxError(f"trial sandbox {self.root} is not prepared (no container)")
        c = self.config
        argv = [shutil.which(c.bwrap_path) or c.bwrap_path, "--unshare-all", "--unshare-user", "--disable-userns",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--uid", "0", "--gid", "0",
                "--hostname", "sandbox"]
        if self.allow_internet and c.network == "host":
            argv.append("--share-net")
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        prof = _profile_dir(None, 0)
        argv += ["--bind", self.rootfs, "/",
                 "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev", "--size", str(c.shm_mb << 20),
                 "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
                 "--bind", str(self.dirs["tmp"]), "/tmp",
                 "--bind", str(self.dirs["logs/agent"]), "/logs/agent",
                 "--bind", str(self.dirs["logs/artifacts"]), "/logs/artifacts",
                 "--ro-bind", prof, "/opt/jaxrl", *c.mirror_binds()]
        for src, dest, writable in phase_binds:
            argv += ["--bind" if writable else "--ro-bind", str(src), dest]
        argv += ["--chdir", cwd or self.environment.workdir, "--clearenv"]
        for k, v in (env if env is not None else self.env()).items():
            argv += ["--setenv", k, v]
        argv += ["--", "/bin/bash", "-c", self._limit_prologue() + 'exec "$@"', "jaxrl-sandbox", *command]
        return argv

    def disk_usage(self) -> tuple[int, int]:
        """(bytes, entries) in the container's writable layer, the trial's /tmp and its logs."""
        paths = [self.dirs[k] for k in ("tmp", "logs/agent", "logs/artifacts", "logs/verifier")]
        if self.layer:
            paths.insert(0, Path(self.layer))
        return disk_usage(paths, stop_at_files=self.limits.max_files + 1)

    def close(self, *, remove: Sequence[str] = ("app", "tmp", "home")) -> None:
        """As `Sandbox.close`, then removes the container (its writable layer with it)."""
        try:
            super().close(remove=[k for k in remove if k in ("tmp",)])
        finally:
            if self.container is not None:
                self.cache.builder.remove_container(self.container)
                _LIVE_CONTAINERS.pop(self.container, None)
                self.container = self.rootfs = None
            if self.image is not None:
                self.cache.release(self.image)
                self.image = None


def _copy_nofollow(dfd: int, name: str, dest: Path, shown: str, skipped: list) -> None:
    """Copies the entry `name` of the directory fd `dfd` to `dest` without following symlinks."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        skipped.append(shown)
        return
    mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
    if stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        with os.fdopen(fd, "rb") as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.chmod(dest, mode)
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            dest.mkdir(exist_ok=True)
            for child in sorted(os.listdir(fd)):
                _copy_nofollow(fd, child, dest / child, f"{shown}/{child}", skipped)
        finally:
            os.close(fd)
        os.chmod(dest, mode | 0o700)
    else:
        skipped.append(shown)


def _place_nofollow(src: Path, dfd: int, name: str) -> None:
    """Writes the host file or directory `src` (made by `_copy_nofollow`) as `name` in the directory fd `dfd`."""
    if src.is_dir():
        os.mkdir(name, 0o755, dir_fd=dfd)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            for child in sorted(src.iterdir()):
                _place_nofollow(child, fd, child.name)
        finally:
            os.close(fd)
        os.chmod(name, stat.S_IMODE(src.stat().st_mode), dir_fd=dfd)
    else:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            shutil.copyfileobj(f, out, 1 << 20)
        os.chmod(name, stat.S_IMODE(src.stat().st_mode), dir_fd=dfd)


_LIVE_CONTAINERS: dict = {}


def _remove_live_containers() -> None:
    for c, builder in list(_LIVE_CONTAINERS.items()):
        builder.remove_container(c)


import atexit  # noqa: E402

atexit.register(_remove_live_containers)


# ---------------------------------------------------------------------------------------------
# Choosing the path per task


def image_spec(env_dir: Path, config, where: str) -> EnvironmentSpec:
    """The `EnvironmentSpec` of a task on the image backend (profile "image"; the workdir is settled at
    trial start from the image's WORKDIR unless task.toml sets one)."""
    base = ""
    df = env_dir / "Dockerfile"
    if df.is_file():
        names = dockerfile_bases(df.read_text(encoding="utf-8", errors="replace"))
        base = names[-1] if names else ""
    elif config.docker_image:
        base = config.docker_image
    else:
        from jaxrl.envs.harbor.errors import UnsupportedEnvironmentError

        raise UnsupportedEnvironmentError(f"{where}: no Dockerfile (and no [environment] docker_image in task.toml)")
    return EnvironmentSpec(profile=IMAGE_PROFILE, base_image=base, workdir=config.workdir or "/",
                           env=tuple(config.environment_env.items()), notes=("built with the image backend",))
