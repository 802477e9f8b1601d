"""Image builders: `Builder`, the small interface the image backend needs from a container tool
(build, tag, image id / size / config, rmi, per-trial containers and their writable layers), and
`BuildahBuilder` (`buildah bud --isolation chroot`, `buildah from` + `buildah mount` per trial) and
`PodmanBuilder` (`podman build --isolation chroot`, `podman create` + `podman mount`), both verified here
(`BUILDERS`). A failed build raises `ImageBuildError`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.fileio import atomic_write_text

log = logging.getLogger(__name__)


HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


class ImageBuildError(SandboxError):
    """A task's image could not be built (or its base image is missing); the message says which step and the fix."""


class Builder:
    """What the image backend needs from a container tool. Subclasses: `BuildahBuilder` and `PodmanBuilder`
    (verified); Docker and Apptainer would be further subclasses (not written or verified)."""

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
            raise SandboxError(f"{self.exe} is not installed: apt-get install {self.name} (the image backend's "
                               "builder)") from None
        except subprocess.TimeoutExpired:
            raise SandboxError(f"`{self.name} {' '.join(args[:2])}` took longer than {timeout:g} s") from None
        if check and r.returncode != 0:
            raise SandboxError(f"`{self.name} {' '.join(args)}` failed: {(r.stderr or r.stdout).strip()[-500:]}")
        return r

    def available(self) -> Optional[str]:
        if shutil.which(self.exe) is None:
            return (f"{self.exe} not found: apt-get install {self.name} (harbor.environment_backend='image' builds "
                    "with it)")
        return None

    def image_id(self, ref: str) -> Optional[str]:
        r = self._run("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref, check=False)
        return r.stdout.strip() or None if r.returncode == 0 else None

    def tag(self, src: str, dst: str) -> None:
        self._run("tag", src, dst)

    _build_verb = ("bud",)

    def build(self, context: str, tag: str, log_path: str, *, pull: bool, timeout: float,
              dockerfile: Optional[str] = None) -> None:
        argv = [self.exe, *self._build_verb, "--isolation", "chroot", "--pull=true" if pull else "--pull=never",
                "--layers=false", "-t", tag, "-f", dockerfile or os.path.join(context, "Dockerfile")]
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
        # the step's own error, not buildah's summary lines that repeat the step
        errs = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("STEP ", "$ ", "Error: building at"))
                and not re.match(r"subprocess exited with status", ln)]
        last = next((ln for ln in reversed(errs) if re.search(r"error|fail|not found|unable", ln, re.I)),
                    errs[-1] if errs else "")
        if code is None:
            raise ImageBuildError(f"the build ran longer than build_timeout_sec={timeout:g} s at {step}; raise "
                                  f"[environment] build_timeout_sec or shorten that step (log: {log_path})")
        base = re.search(r"STEP \d+/\d+: (FROM|COPY --from)", step)
        raise ImageBuildError(f"the build failed at {step}: {last.strip()[:300]}; "
                              + ("map the base image to a local one in harbor.base_images" if base else
                                 "fix that Dockerfile step") + f" (log: {log_path})")

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
        c = self._run(*self._create_args(name, ref)).stdout.strip()
        try:
            m = self._run("mount", c).stdout.strip()
        except SandboxError:
            self.remove_container(c)
            raise
        return c, m

    def _create_args(self, name: str, ref: str) -> tuple:
        """The arguments that make (not start) a container `name` of image `ref`."""
        return ("from", "--pull=never", "-q", "--name", name, ref)

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


class PodmanBuilder(BuildahBuilder):
    """podman (4.x) with `podman build --isolation chroot` (buildah's build code inside podman), and per trial
    `podman create` + `podman mount` (rootful). Nothing is ever run by podman itself: the trial's commands
    run in bwrap over the mounted root, as with buildah (`podman run` needs an OCI runtime, which this
    path does not). Podman and buildah share the containers/storage image store.

    Args:
      podman: the podman executable.
      volumes: extra `-v` specs for every RUN step (the host CA bundle is added when it exists).
    """

    name = "podman"
    _build_verb = ("build",)

    def __init__(self, podman: str = "podman", volumes: Sequence[str] = ()):
        super().__init__(podman, volumes)

    def _inspect(self, ref: str) -> Optional[dict]:
        r = self._run("image", "inspect", ref, check=False)
        try:
            rows = json.loads(r.stdout) if r.returncode == 0 else []
        except ValueError:
            return None
        return rows[0] if rows else None

    def image_id(self, ref: str) -> Optional[str]:
        row = self._inspect(ref)
        return (row or {}).get("Id") or None

    def image_size(self, ref: str) -> int:
        return int((self._inspect(ref) or {}).get("Size") or 0)

    def image_config(self, ref: str) -> dict:
        row = self._inspect(ref)
        if row is None:
            raise SandboxError(f"`podman image inspect {ref}` found no image")
        cfg = row.get("Config") or {}
        env = [tuple(kv.partition("=")[::2]) for kv in cfg.get("Env") or []]
        return {"workdir": cfg.get("WorkingDir") or "/", "env": env, "user": cfg.get("User") or ""}

    def _containers(self) -> list:
        """Every container in the store, podman's and buildah's (`--external`)."""
        r = self._run("ps", "--all", "--external", "--format", "json", check=False)
        try:
            return json.loads(r.stdout or "[]") or []
        except ValueError:
            return []

    def images_in_use(self) -> set:
        return {c.get("ImageID", "") for c in self._containers()}

    def _create_args(self, name: str, ref: str) -> tuple:
        # the command is never run (bwrap runs the trial's commands); podman create only needs one set
        return ("create", "--pull=never", "--name", name, ref, "/bin/true")

    def remove_container(self, container: str) -> None:
        self._run("rm", "--force", container, check=False)

    def remove_stale_containers(self) -> list[str]:
        """As `BuildahBuilder.remove_stale_containers`, for podman's containers."""
        removed = []
        for row in self._containers():
            for name in row.get("Names") or []:
                m = re.fullmatch(re.escape(CONTAINER_PREFIX) + r"(\d+)-[0-9a-f]+", name)
                if m and not _pid_alive(int(m.group(1))):
                    if self._run("rm", "--force", name, check=False).returncode == 0:
                        removed.append(name)
                        log.info("image cache: removed the container %s of a process that ended", name)
        return removed


BUILDERS = {"buildah": BuildahBuilder, "podman": PodmanBuilder}
