"""The image backend's Dockerfile logic that needs no builder (jaxrl/envs/harbor/dockerfile.py, the image
cache's settings): the build hash, image names, FROM / COPY --from rewriting, and the Dockerfile reading
the profile path shares (logical lines, exec form, RUN chains). Expected values by hand. The builds
themselves are in tests/test_image_backend.py (needs buildah; a real-component tier)."""
from __future__ import annotations

import os

import pytest

from jaxrl.envs.harbor.dockerfile import (_dockerfile_lines, _expand, _split_chain, context_hash, dockerfile_bases,
                                          exec_form, image_tag, qualified, rewrite_bases)
from jaxrl.envs.harbor.image_cache import ImageCacheConfig

STAND_IN = "localhost/debian-stand-in:bookworm"
BASE_MAP = (("ubuntu:24.04", STAND_IN),)


def _context(root):
    env = root / "environment"
    (env / "sub").mkdir(parents=True)
    (env / "Dockerfile").write_text("FROM ubuntu:24.04\nCOPY data.txt /data.txt\n")
    (env / "data.txt").write_text("data\n")
    (env / "sub" / "x.txt").write_text("x\n")
    return env


def test_the_build_hash_changes_with_every_input_it_names_and_only_with_them(tmp_path):
    """context_hash's docstring lists what identifies a build: paths, entry types, permission bits,
    contents, symlink targets (not followed), the base-image map and ids, the builder, docker_image."""
    env = _context(tmp_path)
    h = context_hash(env, dict(BASE_MAP))
    assert len(h) == 64 and int(h, 16) >= 0
    assert context_hash(env, dict(BASE_MAP)) == h  # deterministic
    assert context_hash(env, {"b": "2", "a": "1"}) == context_hash(env, {"a": "1", "b": "2"})  # map order
    seen = {h}

    def changed(**kw):
        args = {"base_images": dict(BASE_MAP), **kw}
        new = context_hash(env, **args)
        assert new not in seen, kw
        seen.add(new)

    changed(base_images={})
    changed(builder="podman")
    changed(docker_image="ubuntu:22.04")
    changed(base_ids={"ubuntu:24.04": "sha256:1"})
    (env / "data.txt").write_text("changed\n")
    changed()
    os.chmod(env / "data.txt", 0o600)
    changed()
    (env / "sub" / "x.txt").rename(env / "sub" / "y.txt")
    changed()
    os.symlink("data.txt", env / "link")
    changed()
    os.remove(env / "link")
    os.symlink("sub", env / "link")  # another target: the link is not followed, its target is hashed
    changed()
    (env / "empty").mkdir()
    changed()


def test_image_names():
    assert image_tag("0123456789abcdef" + "f" * 48) == "localhost/jaxrl-task:0123456789abcdef"
    assert qualified("ubuntu:24.04") == "docker.io/library/ubuntu:24.04"
    assert qualified("org/x:1") == "docker.io/org/x:1"
    for kept in ("ghcr.io/astral-sh/uv:0.5.0", "localhost/x:1", "registry:5000/x", "docker.io/library/u:1"):
        assert qualified(kept) == kept


def test_rewrite_bases_maps_from_and_copy_from_without_touching_stages():
    text = ("ARG BASE=python:3.12\nFROM ubuntu:24.04 AS gen\nRUN true\nFROM ${BASE}\n"
            "COPY --from=gen /a /a\nCOPY --from=ghcr.io/astral-sh/uv:0.5.0 /uv /bin/uv\n"
            "COPY --from=docker.io/library/busybox:1 /bin/busybox /bin/\nFROM scratch\nCOPY --from=1 /x /x\n")
    new, unmapped = rewrite_bases(text, {"ubuntu:24.04": "localhost/u:1", "docker.io/library/python:3.12": "localhost/p:1",
                                         "busybox:1": "localhost/b:1"})
    assert new == ("ARG BASE=python:3.12\nFROM localhost/u:1 AS gen\nRUN true\nFROM localhost/p:1\n"
                   "COPY --from=gen /a /a\nCOPY --from=ghcr.io/astral-sh/uv:0.5.0 /uv /bin/uv\n"
                   "COPY --from=docker.io/library/busybox:1 /bin/busybox /bin/\nFROM scratch\nCOPY --from=1 /x /x\n"), new
    # busybox's qualified name is not a key: only the short name is, and qualified() of the long name is itself
    assert unmapped == ["ghcr.io/astral-sh/uv:0.5.0", "docker.io/library/busybox:1"]
    # a mapped COPY --from image is replaced in place
    new, unmapped = rewrite_bases("FROM scratch\nCOPY --from=busybox:1 /bin/sh /sh\n", {"busybox:1": "localhost/b:1"})
    assert (new, unmapped) == ("FROM scratch\nCOPY --from=localhost/b:1 /bin/sh /sh\n", [])


def test_dockerfile_bases():
    text = "ARG V=3.12\nFROM python:${V}-slim AS build\nRUN x\nFROM build\nFROM --platform=linux/amd64 ubuntu:24.04\n" \
           "COPY --from=build /a /a\n"
    assert dockerfile_bases(text) == ["python:3.12-slim", "ubuntu:24.04"]
    assert dockerfile_bases("FROM \\\n  ubuntu:24.04\n") == ["ubuntu:24.04"]  # a continued FROM line


def test_logical_lines_exec_form_and_run_chains():
    text = "# c\n\nFROM a\nRUN x \\\n# inside: dropped\n  && y\nENV K=v \\\n"
    assert _dockerfile_lines(text) == [(3, "FROM a"), (4, "RUN x    && y"), (7, "ENV K=v  ")]
    assert exec_form('["sh", "-c", "x"]') == ["sh", "-c", "x"]
    for shell in ("[ -e /x ] || true", "[1, 2]", '{"a": 1}', "echo [x]", '["a", 1]'):
        assert exec_form(shell) is None, shell
    assert _split_chain("a && b || c; d") == ["a", "b", "c", "d"]
    assert _split_chain("""echo 'x && y'; echo "p \\" ; q" && z""") == ["echo 'x && y'", 'echo "p \\" ; q"', "z"]
    assert _expand("$A-${B:-dflt}-${C}-$D", {"A": "1", "C": "3"}) == "1-dflt-3-"


def test_image_cache_settings_are_checked_in_one_line():
    ImageCacheConfig(base_images=BASE_MAP).validate()
    assert ImageCacheConfig(base_images=BASE_MAP).base_map == {"ubuntu:24.04": STAND_IN}
    assert str(ImageCacheConfig(cache_dir="/x/y").dir) == "/x/y"
    for cfg, words in ((ImageCacheConfig(builder="docker"), "harbor.image_builder='docker'"),
                       (ImageCacheConfig(max_mb=0), "harbor.image_cache_max_mb=0"),
                       (ImageCacheConfig(build_concurrency=0), "harbor.build_concurrency=0"),
                       (ImageCacheConfig(base_images=(("ubuntu:24.04", ""),)), "harbor.base_images entry")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")) as e:
            cfg.validate()
        assert "\n" not in str(e.value)


def test_config_keys_are_validated_with_one_line_errors():
    from jaxrl import config as config_lib

    c = config_lib.base_config()
    assert c.harbor.environment_backend == "profile"
    for key, bad, words in (("environment_backend", "docker", "use 'profile', 'image' or 'auto'"),
                            ("base_images", ("ubuntu:24.04",), "not 'FROM name=local image'"),
                            ("build_concurrency", 0, ">= 1"), ("image_cache_max_mb", -5, "positive")):
        c2 = config_lib.base_config()
        c2.harbor[key] = bad
        with pytest.raises(config_lib.ConfigError) as e:
            config_lib._validate_harbor(c2, False)
        assert f"harbor.{key}" in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    c.harbor.base_images = ("ubuntu:24.04=" + STAND_IN,)
    config_lib._validate_harbor(c, False)
    assert config_lib.image_cache_config(c.harbor).base_images == BASE_MAP
