"""`ImageSandbox`: a trial's sandbox on the task's built image (a fresh writable container per trial,
bwrap over its root), with the no-follow copies in and out of the container (`copy_out`, `place`:
no symlink of the image is followed). Containers still alive at exit are removed.
"""
from __future__ import annotations

import atexit
import logging
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

log = logging.getLogger(__name__)


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
        # every command runs under /bin/bash (the limit prologue): say so before the first one fails
        if not any(os.path.lexists(os.path.join(self.rootfs, d, "bash")) for d in ("bin", "usr/bin")):
            raise SandboxError(f"the image of task {self.task.name} has no /bin/bash, which the sandbox runs every "
                               "command with: install bash in its Dockerfile, or map its base image to one that "
                               "has bash (harbor.base_images)")
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

    def copy_out(self, path: str, dest: Path, budget: Optional["_Budget"] = None) -> list[str]:
        """Copies `path` (a file or directory of the container, absolute) to the host path `dest`.

        Nothing is followed out of the container: every component is opened with O_NOFOLLOW, symlinks
        and special files inside it are skipped (as Harbor's tar `data` filter skips them), and only
        regular files and directories are copied, with their permission bits less setuid/setgid. The
        copy stays within `budget` (default: this trial's storage and file limits; share one
        `artifact_budget()` across the artifacts of a trial) and `MAX_ARTIFACT_DEPTH` levels.

        Returns:
          None when `path` does not exist, else the container paths that were skipped (symlinks,
          devices, sockets, FIFOs; `[path]` when `path` itself is one of them).

        Raises:
          SandboxError: the artifact is over the budget or nests too deep (what was copied is kept).
        """
        budget = budget or self.artifact_budget()
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
            _copy_nofollow(dfd, parts[-1], Path(dest), path, skipped, budget)
        finally:
            os.close(dfd)
        return skipped

    def artifact_budget(self) -> "_Budget":
        """A fresh copy budget of this trial's limits (`copy_out`)."""
        return _Budget(self.limits)

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


MAX_ARTIFACT_DEPTH = 128
"""Directory levels an artifact may nest (deeper ones are refused, not copied)."""


class _Budget:
    """What an artifact copy may write: the trial's storage limit in bytes (apparent sizes: a sparse
    file is written in full) and its file limit, shared by all artifacts of a trial."""

    def __init__(self, limits: Limits):
        self.bytes, self.files, self.limits = limits.storage_mb * 10 ** 6, limits.max_files, limits

    def take(self, nbytes: int, shown: str) -> None:
        self.bytes -= nbytes
        self.files -= 1
        if self.bytes < 0 or self.files < 0:
            raise SandboxError(f"the artifacts are larger than the trial's storage limit ({self.limits.storage_mb} MB, "
                               f"{self.limits.max_files} files; at {shown}): only that much is copied to the verifier")


def _copy_nofollow(dfd: int, name: str, dest: Path, shown: str, skipped: list, budget: _Budget) -> None:
    """Copies the entry `name` of the directory fd `dfd` to the host path `dest` without following symlinks,
    depth-first without recursion (at most `MAX_ARTIFACT_DEPTH` levels), within `budget`.

    Raises:
      SandboxError: the artifact nests deeper than `MAX_ARTIFACT_DEPTH` or exceeds the budget.
    """
    out_parent = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
    # (source dir fd, entry name, destination dir fd, destination name, shown path, depth); ("close", ...) markers
    stack: list = [("copy", dfd, name, out_parent, dest.name, shown, 0)]
    owned: list = [out_parent]
    try:
        while stack:
            item = stack.pop()
            if item[0] == "close":
                _, sfd, ofd, oname, oparent, mode = item
                os.chmod(oname, mode | 0o700, dir_fd=oparent)
                os.close(sfd)
                os.close(ofd)
                owned.remove(sfd)
                owned.remove(ofd)
                continue
            _, sdir, sname, odir, oname, shown_path, depth = item
            try:
                st = os.stat(sname, dir_fd=sdir, follow_symlinks=False)
            except FileNotFoundError:
                skipped.append(shown_path)
                continue
            mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
            if stat.S_ISREG(st.st_mode):
                budget.take(st.st_size, shown_path)
                fd = os.open(sname, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=sdir)
                ofd = os.open(oname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=odir)
                with os.fdopen(fd, "rb") as src, os.fdopen(ofd, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(oname, mode, dir_fd=odir)
            elif stat.S_ISDIR(st.st_mode):
                if depth >= MAX_ARTIFACT_DEPTH:
                    raise SandboxError(f"the artifact {shown_path[:60]}... nests directories deeper than "
                                       f"{MAX_ARTIFACT_DEPTH} levels; it is not copied to the verifier")
                budget.take(0, shown_path)
                sfd = os.open(sname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=sdir)
                owned.append(sfd)
                os.mkdir(oname, 0o700, dir_fd=odir)
                ofd = os.open(oname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=odir)
                owned.append(ofd)
                stack.append(("close", sfd, ofd, oname, odir, mode))
                for child in sorted(os.listdir(sfd), reverse=True):
                    stack.append(("copy", sfd, child, ofd, child, f"{shown_path}/{child}", depth + 1))
            else:
                skipped.append(shown_path)
    finally:
        for fd in owned:
            os.close(fd)


def _place_nofollow(src: Path, dfd: int, name: str) -> None:
    """Writes the host file or directory `src` (made by `_copy_nofollow`: no symlinks, at most
    `MAX_ARTIFACT_DEPTH` levels) as `name` in the directory fd `dfd`, depth-first without recursion."""
    src_root = os.open(src.parent, os.O_RDONLY | os.O_DIRECTORY)
    stack: list = [("copy", src_root, src.name, dfd, name)]
    owned: list = [src_root]
    try:
        while stack:
            item = stack.pop()
            if item[0] == "close":
                _, sfd, ofd, oname, odir, mode = item
                os.chmod(oname, mode, dir_fd=odir)
                for fd in (sfd, ofd):
                    os.close(fd)
                    owned.remove(fd)
                continue
            _, sdir, sname, odir, oname = item
            st = os.stat(sname, dir_fd=sdir, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sfd = os.open(sname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=sdir)
                owned.append(sfd)
                os.mkdir(oname, 0o755, dir_fd=odir)
                ofd = os.open(oname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=odir)
                owned.append(ofd)
                stack.append(("close", sfd, ofd, oname, odir, stat.S_IMODE(st.st_mode)))
                for child in sorted(os.listdir(sfd), reverse=True):
                    stack.append(("copy", sfd, child, ofd, child))
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(sname, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=sdir)
                ofd = os.open(oname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=odir)
                with os.fdopen(fd, "rb") as f, os.fdopen(ofd, "wb") as out:
                    shutil.copyfileobj(f, out, 1 << 20)
                os.chmod(oname, stat.S_IMODE(st.st_mode), dir_fd=odir)
    finally:
        for fd in owned:
            os.close(fd)


def collect_artifacts(sb: "ImageSandbox", paths, art: Path, trial_name: str = "") -> tuple[list, Optional[Path], dict]:
    """Copies a trial's artifacts out of the agent's container `sb` into the host folder `art` (recreated),
    for a separate verifier: each path of `paths` (`copy_out`), then Harbor's convention directory (the
    agent's /logs/artifacts), all within one budget of the trial's limits. An artifact over the budget or
    too deep stops the collection there (what came before is kept): it is the agent's output, so the
    verifier judges what arrived and the record says why the rest did not.

    Returns:
      ([(host copy, container path), ...] to place, the copied convention directory or None,
       {"collected", "missing", "skipped"[, "refused"]} for the trial's `info["artifacts"]`).
    """
    from jaxrl.envs.harbor.fsutil import remove_tree

    remove_tree(art)
    art.mkdir()
    collected, missing, skipped, refused = [], [], [], ""
    budget = sb.artifact_budget()
    for i, path in enumerate(paths):
        try:
            out = sb.copy_out(path, art / str(i), budget)
        except (SandboxError, OSError) as e:
            refused = f"{path}: {e}"
            break
        if out is None:
            missing.append(path)
            continue
        skipped += out
        if out != [path]:
            collected.append((art / str(i), path))
    conv: Optional[Path] = art / "logs-artifacts"
    if not refused and any(sb.dirs["logs/artifacts"].iterdir()):
        lfd = os.open(sb.dirs["logs/artifacts"].parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _copy_nofollow(lfd, "artifacts", conv, "/logs/artifacts", skipped, budget)
        except (SandboxError, OSError) as e:
            refused = f"/logs/artifacts: {e}"
            remove_tree(conv)
        finally:
            os.close(lfd)
    if not conv.is_dir():
        conv = None
    info = {"collected": [p for _, p in collected], "missing": missing, "skipped": skipped}
    if refused:
        info["refused"] = refused
        log.warning("trial %s: artifacts not all copied to the verifier: %s", trial_name, refused)
    if skipped:
        log.warning("trial %s: skipped %d symlinks or special files in the artifacts, e.g. %s", trial_name,
                    len(skipped), skipped[0])
    return collected, conv, info


_LIVE_CONTAINERS: dict = {}


def _remove_live_containers() -> None:
    for c, builder in list(_LIVE_CONTAINERS.items()):
        builder.remove_container(c)


atexit.register(_remove_live_containers)
