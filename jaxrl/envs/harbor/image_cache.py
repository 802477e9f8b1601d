"""The image cache: `ImageCacheConfig` (the `harbor.*` image settings) and `ImageCache`, which builds
a task's image once per build context (`dockerfile.context_hash`), maps base images to local ones
before a build (`dockerfile.rewrite_bases`; never pulled unless configured), keeps an index of the
images it built (`index.json`, written atomically under a file lock), builds at most
`build_concurrency` images at once across processes, and evicts the least recently used images
not in use above `max_mb`. `image_cache(config)` is the process-wide cache for some settings.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from jaxrl.envs.harbor.builders import BUILDERS, Builder, ImageBuildError
from jaxrl.envs.harbor.dockerfile import context_hash, dockerfile_bases, image_tag, qualified, rewrite_bases
from jaxrl.fileio import atomic_write_text

log = logging.getLogger(__name__)


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
      builder: "buildah" or "podman" (`builders.BUILDERS`).
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
            raise ValueError(f"harbor.image_builder={self.builder!r}: use one of {sorted(BUILDERS)}")
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
                                      "local image; build it first (docs/terminal_tasks.md, 'Local base images')")
        new, unmapped = rewrite_bases(text, bases)
        for name in unmapped:
            if not self.config.pull and not (self.builder.image_id(name) or self.builder.image_id(qualified(name))):
                raise ImageBuildError(f"task {task.name}: image {name} (FROM or COPY --from): no local image of that "
                                      f"name and images are not pulled; map it in harbor.base_images (--base-image), "
                                      f"e.g. '{name}=localhost/debian-stand-in:bookworm' (docs/terminal_tasks.md, "
                                      "'Local base images')")
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
