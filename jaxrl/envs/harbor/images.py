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

Where the pieces live: Dockerfile scanning, base-image rewriting and the context hash in
`dockerfile.py`, the builders in `builders.py`, the cache in `image_cache.py`, the sandbox on a built
image in `image_sandbox.py`; this module chooses the path per task (`image_spec`, `BACKENDS`) and
re-exports the rest.
"""
from __future__ import annotations

from pathlib import Path

from jaxrl.envs.harbor.builders import (BUILDERS, CONTAINER_PREFIX, HOST_CA, Builder,  # noqa: F401
                                        BuildahBuilder, ImageBuildError)
from jaxrl.envs.harbor.dockerfile import (TAG_REPO, context_hash, dockerfile_bases, image_tag,  # noqa: F401
                                          qualified, rewrite_bases)
from jaxrl.envs.harbor.image_cache import ImageCache, ImageCacheConfig, image_cache  # noqa: F401
from jaxrl.envs.harbor.image_sandbox import DEFAULT_PATH, ImageSandbox  # noqa: F401
from jaxrl.envs.harbor.profiles import EnvironmentSpec

IMAGE_PROFILE = "image"
"""`EnvironmentSpec.profile` of tasks whose environment is built (the image backend)."""
BACKENDS = ("profile", "image", "auto")


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
