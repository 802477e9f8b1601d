"""`ImageSandbox`: a trial's sandbox on the task's built image (a fresh writable container per trial,
bwrap over its root), with the no-follow copies in and out of the container (`copy_out`, `place`:
no symlink of the image is followed). Containers still alive at exit are removed.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import stat
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.fsutil import disk_usage
from jaxrl.envs.harbor.image_cache import ImageCache, ImageCacheConfig, image_cache
from jaxrl.envs.harbor.profile_dir import _profile_dir
from jaxrl.envs.harbor.profiles import EnvironmentSpec
from jaxrl.envs.harbor.sandbox import Sandbox
from jaxrl.envs.harbor.sandbox_config import Limits, SandboxConfig


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


atexit.register(_remove_live_containers)
