"""The image-backend flags that `python -m jaxrl.tasks check / run-oracle` and `python -m
jaxrl.tasks funnel --gate` share (--base-image, --image-cache-dir, --image-cache-max-mb,
--build-concurrency, --pip-mirror): their one-line check and the `ImageCacheConfig` they make.

Both commands import this module (it imports no command module), so the funnel (a library module
with its own `main`) does not import `jaxrl.tasks`.
"""
from __future__ import annotations

import os


def image_options_problem(args) -> str | None:
    """One line naming the first image-backend flag (--base-image, --image-cache-dir,
    --image-cache-max-mb, --build-concurrency) with a bad value, and the fix; None when all are good
    (checked before any task is loaded or built)."""
    if not hasattr(args, "base_image"):
        return None
    from jaxrl.config import base_image_pairs
    from jaxrl.fileio import output_dir_problem

    for entry in args.base_image or ():
        try:
            (name, local), = base_image_pairs((entry,))
        except ValueError:
            name, local = "", "="
        if "=" in local or not name:
            return (f"--base-image {entry!r}: not NAME=LOCAL. Fix: e.g. --base-image "
                    "ubuntu:24.04=localhost/debian-stand-in:bookworm (an image name has no '=')")
    try:
        base_image_pairs(args.base_image or ())
    except ValueError as e:
        return f"--base-image: {e}. Fix: pass one --base-image NAME=LOCAL per base image"
    mirror = getattr(args, "pip_mirror", None)
    if mirror is not None and os.path.exists(mirror) and not os.path.isdir(mirror):
        return (f"--pip-mirror {mirror!r}: a file, not a folder. Fix: pass the folder that holds the wheels "
                f"(e.g. {os.path.dirname(os.path.abspath(mirror))})")
    if mirror is not None and not os.path.isdir(mirror):
        return (f"--pip-mirror {mirror!r}: no such folder. Fix: make it with `pip download -d {mirror} "
                "pytest==VER ...` (docs/terminal_tasks.md, 'Network')")
    tools = getattr(args, "tool_mirror", None)
    if tools is not None:
        make = f"make it with `launch/make_tool_mirror.sh {tools or 'DIR'} --uv VER` (docs/terminal_tasks.md, 'Network')"
        if not tools:
            return f"--tool-mirror is empty. Fix: pass a folder; {make}"
        if os.path.exists(tools) and not os.path.isdir(tools):
            return f"--tool-mirror {tools!r}: a file, not a folder. Fix: pass a folder that holds bin/, or {make}"
        if not os.path.isdir(tools):
            return f"--tool-mirror {tools!r}: no such folder. Fix: {make}"
        bin_dir = os.path.join(tools, "bin")
        if not os.path.isdir(bin_dir) or not os.listdir(bin_dir):
            return f"--tool-mirror {tools!r}: no programs in its bin/ folder. Fix: {make}"
    if args.image_cache_dir:
        problem = output_dir_problem(args.image_cache_dir)
        if problem:
            return f"--image-cache-dir: {problem}. Fix: pass a directory path in a writable folder"
    if args.image_cache_max_mb < 1:
        return f"--image-cache-max-mb {args.image_cache_max_mb}: must be a positive number of megabytes. Fix: e.g. 20480"
    if args.build_concurrency < 1:
        return f"--build-concurrency {args.build_concurrency}: must be at least 1. Fix: 1 fits 2 cores"
    return None


def image_config(args):
    """The `image_cache.ImageCacheConfig` of the image-backend flags (`args.base_image`,
    `args.image_cache_dir`, `args.image_cache_max_mb`, `args.build_concurrency`)."""
    from jaxrl.config import base_image_pairs
    from jaxrl.envs.harbor.image_cache import ImageCacheConfig

    return ImageCacheConfig(base_images=base_image_pairs(args.base_image or ()), cache_dir=args.image_cache_dir,
                            max_mb=args.image_cache_max_mb, build_concurrency=args.build_concurrency,
                            builder=getattr(args, "image_builder", "buildah"))
