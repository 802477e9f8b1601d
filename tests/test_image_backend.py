"""The image backend (jaxrl/envs/harbor/images.py): tasks whose Dockerfile the profile path refuses are
built with buildah and their trials run on a container of the built image, with the sandbox's guarantees.

Needs `buildah` (skipped without it; `.ci/run` installs it) and a local Debian base: the session fixture
makes `localhost/debian-stand-in:bookworm` from `~/.cache/jaxrl/images/debian-bookworm-minbase.tar`
(mmdebstrap, once; reruns reuse the tar and the image).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("buildah") is None,
                                reason="buildah is not installed (apt-get install buildah mmdebstrap); "
                                       "the image backend builds with it")

from harbor_helpers import PROBE_PRELUDE, descendants, limit_configs  # noqa: E402

from jaxrl.envs.harbor import Outcome, SandboxConfig, Trial, TrialConfig, load_task, run_trial  # noqa: E402
from jaxrl.envs.harbor.errors import SandboxError  # noqa: E402
from jaxrl.envs.harbor.images import (BuildahBuilder, ImageCache, ImageCacheConfig, ImageSandbox,  # noqa: E402
                                      context_hash, image_cache, image_tag)

STAND_IN = "localhost/debian-stand-in:bookworm"
BASE_MAP = (("ubuntu:24.04", STAND_IN),)

DOCKERFILE = """\
FROM ubuntu:24.04 AS gen
RUN mkdir -p /stage && echo seed-value > /stage/seed.txt

FROM ubuntu:24.04
RUN mkdir -p /workspace && apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pytest \\
    && rm -rf /var/lib/apt/lists/*
COPY --from=gen /stage/seed.txt /opt/seed.txt
COPY data.txt /workspace/data.txt
WORKDIR /workspace
"""

TEST_SH = """\
#!/bin/bash
cat > /tmp/test_out.py <<'PY'
def test_out():
    assert open("/workspace/out.txt").read() == open("/opt/seed.txt").read()
PY
if python3 -m pytest -q /tmp/test_out.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def _buildah(*args, check=True) -> str:
    r = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=600)
    if check and r.returncode:
        raise RuntimeError(f"buildah {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip() if r.returncode == 0 else ""


def _image_id(ref: str) -> str:
    return _buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref, check=False)


def _cat(ref: str, rel: str) -> str:
    """A file of an image, read from a throwaway container."""
    c = _buildah("from", "--pull=never", "-q", ref)
    try:
        return (Path(_buildah("mount", c)) / rel).read_text()
    finally:
        _buildah("rm", c, check=False)


@pytest.fixture(scope="session")
def stand_in():
    """`localhost/debian-stand-in:bookworm` (and `ubuntu:24.04` tagged to it), made once per machine."""
    if not _image_id(STAND_IN):
        cache = Path.home() / ".cache" / "jaxrl" / "images"
        cache.mkdir(parents=True, exist_ok=True)
        tar = cache / "debian-bookworm-minbase.tar"
        if not tar.is_file():
            if shutil.which("mmdebstrap") is None:
                pytest.fail("the Debian base stand-in needs mmdebstrap: apt-get install mmdebstrap")
            part = tar.with_suffix(".tar.part")
            r = subprocess.run(["mmdebstrap", "--format=tar", "--variant=minbase", "--include=ca-certificates", "bookworm", str(part)],
                               capture_output=True, text=True, timeout=900)
            if r.returncode:
                pytest.fail(f"mmdebstrap failed (it needs the Debian mirror): {r.stderr.strip()[-500:]}")
            os.replace(part, tar)
        c = _buildah("from", "scratch")
        try:
            _buildah("add", c, str(tar), "/")
            _buildah("commit", "-q", c, STAND_IN)
        finally:
            _buildah("rm", c, check=False)
    return _image_id(STAND_IN)


@pytest.fixture(scope="module")
def images(tmp_path_factory, stand_in):
    """The image settings of this module (its own cache index and logs)."""
    return ImageCacheConfig(base_images=BASE_MAP, cache_dir=str(tmp_path_factory.mktemp("image-cache")))


def write_task(root: Path, name: str, *, solve: str = 'cp /opt/seed.txt "$PWD/out.txt"\n', test_sh: str = TEST_SH,
               storage_mb: int = 512, memory_mb: int = 1024, dockerfile: str = DOCKERFILE) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "task.toml").write_text(textwrap.dedent(f"""\
        [task]
        name = "{name}"
        [agent]
        timeout_sec = 120
        [verifier]
        timeout_sec = 120
        [environment]
        memory_mb = {memory_mb}
        storage_mb = {storage_mb}
        """))
    (d / "instruction.md").write_text("Copy /opt/seed.txt to out.txt in the working directory.\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "environment" / "data.txt").write_text("data\n")
    (d / "tests" / "test.sh").write_text(test_sh)
    os.chmod(d / "tests" / "test.sh", 0o755)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    return d


@pytest.fixture(scope="module")
def task_root(tmp_path_factory):
    return tmp_path_factory.mktemp("image-tasks")


# ---------------------------------------------------------------------------------------------
# (a) a task the profile path refuses: built, oracle 1, wrong solution 0


def test_refused_task_builds_and_passes_the_gate(task_root, images, capsys, tmp_path):
    from jaxrl import tasks as tasks_cli
    from jaxrl.envs.harbor import HarborTaskError

    d = write_task(task_root, "multistage")
    with pytest.raises(HarborTaskError, match="outside /app"):
        load_task(d)  # the profile path refuses RUN mkdir outside /app
    assert load_task(d, environment_backend="auto").environment.profile == "image"
    t0 = time.monotonic()
    code = tasks_cli.main(["check", str(d), "--environment-backend", "auto", "--all",
                           "--base-image", "ubuntu:24.04=" + STAND_IN, "--image-cache-dir", images.cache_dir,
                           "--trials-dir", str(tmp_path / "trials")])
    out, err = capsys.readouterr()
    print(f"check (build included when the image is new): {time.monotonic() - t0:.1f} s")
    assert code == 0, out + err
    assert "1 built as images" in err
    # the verifier's own reward files, read independently of the runner
    rewards = sorted((p.parent.parent.parent.name, p.read_text().strip())
                     for p in (tmp_path / "trials").rglob("verifier/reward.txt"))
    assert sorted(r for _, r in rewards) == ["0", "1"], rewards  # the oracle's trial 1, the empty agent's 0
    tag = image_tag(context_hash(d / "environment", dict(BASE_MAP), "buildah",
                                 base_ids={"ubuntu:24.04": _image_id(STAND_IN)}))
    assert _image_id(tag), tag  # the image is the one named by the context hash

    wrong = write_task(task_root, "multistage-wrong", solve='echo wrong > "$PWD/out.txt"\n')
    r = run_trial(load_task(wrong, environment_backend="image"), config=TrialConfig(keep="all", images=images),
                  trial_dir=tmp_path / "wrong", agent=lambda trial: trial.run_oracle())
    assert (tmp_path / "wrong" / "logs" / "verifier" / "reward.txt").read_text().strip() == "0"
    assert r.outcome == Outcome.OK and r.reward == 0.0, r.error


# The verifier shape of the public collections (e.g. terminal-bench-math-modeling): fetch uv from astral.sh
# (no network here: it fails), then `uvx --with pytest==... pytest`. The tool mirror brings uv (PyPI's wheel),
# the pip mirror pytest; uv must find both without network.
UV_VERSION = "0.9.7"
UVX_TEST = """\
#!/bin/bash
apt-get update && apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
source $HOME/.local/bin/env
cat > /tmp/test_state.py <<'PY'
def test_out():
    assert open("/workspace/out.txt").read() == open("/opt/seed.txt").read()
PY
uvx --with pytest==8.4.1 pytest /tmp/test_state.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


@pytest.fixture(scope="session")
def uv_mirrors():
    """(tool mirror with uv and uvx from PyPI's uv wheel, pip mirror with pytest 8.4.1), cached per machine."""
    root = Path.home() / ".cache" / "jaxrl" / "test-mirrors"
    tools, wheels = root / f"tools-uv-{UV_VERSION}", root / "pytest-8.4.1"
    repo = Path(__file__).resolve().parents[1]
    if not (tools / "bin" / "uvx").is_file():
        r = subprocess.run([str(repo / "launch" / "make_tool_mirror.sh"), str(tools), "--uv", UV_VERSION],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"make_tool_mirror.sh (it needs PyPI): {r.stderr[-500:]}"
    if not list(wheels.glob("pytest-8.4.1-*.whl")):
        r = subprocess.run(["pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11", "-d",
                            str(wheels), "pytest==8.4.1"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"pip download (it needs PyPI): {r.stderr[-500:]}"
    return str(tools), str(wheels)


def test_a_uvx_verifier_runs_offline_on_the_tool_and_pip_mirrors(task_root, images, uv_mirrors, tmp_path):
    tools, wheels = uv_mirrors
    d = write_task(task_root, "uvx-verifier", test_sh=UVX_TEST)
    task = load_task(d, environment_backend="image")
    assert SandboxConfig().network == "none"  # no network in the trial, whatever the task says
    both = TrialConfig(keep="all", images=images, sandbox=SandboxConfig(tool_mirror=tools, pip_mirror=wheels))
    r = run_trial(task, config=both, trial_dir=tmp_path / "both", agent=lambda trial: trial.run_oracle())
    out = (tmp_path / "both" / "logs" / "verifier" / "test-stdout.txt").read_text()
    assert r.reward == 1.0 and "1 passed" in out, out[-2000:]
    assert "Could not resolve host" in out or "curl: command not found" in out or "curl: (" in out, out[-2000:]
    # the same verifier without the tool mirror: no uvx, reward 0 (the pip mirror alone does not bring uv)
    r = run_trial(task, config=TrialConfig(keep="all", images=images, sandbox=SandboxConfig(pip_mirror=wheels)),
                  trial_dir=tmp_path / "no-tools", agent=lambda trial: trial.run_oracle())
    out = (tmp_path / "no-tools" / "logs" / "verifier" / "test-stdout.txt").read_text()
    assert r.reward == 0.0 and "uvx: command not found" in out, out[-2000:]


SEPARATE_TOML = """\
artifacts = ["/root/results/r.json", "/root/results/link", "/root/results/dir"]
[task]
name = "separate-verifier"
[agent]
timeout_sec = 120
[verifier]
timeout_sec = 120
environment_mode = "separate"
[environment]
memory_mb = 1024
storage_mb = 512
allow_internet = false
"""
SEPARATE_SOLVE = """\
#!/bin/bash
mkdir -p /root/results/dir/sub
echo '{"answer": 42}' > /root/results/r.json
echo nested > /root/results/dir/sub/n.txt
ln -s /etc/hostname /root/results/link           # a symlink artifact: resolved on the host it would leak
ln -s /etc/passwd /root/results/dir/sub/leak     # the host's files; it must not be followed or copied
echo agent-only > /root/agent-only.txt           # not an artifact: the verifier must not see it
"""
SEPARATE_TEST = """\
#!/bin/bash
ok=1
[ "$(cat /root/results/r.json 2>/dev/null)" = '{"answer": 42}' ] || { echo "no artifact"; ok=0; }
[ "$(cat /root/results/dir/sub/n.txt 2>/dev/null)" = nested ] || { echo "no nested artifact"; ok=0; }
[ -e /root/results/link ] || [ -L /root/results/link ] && { echo "symlink artifact copied"; ok=0; }
[ -e /root/results/dir/sub/leak ] || [ -L /root/results/dir/sub/leak ] && { echo "inner symlink copied"; ok=0; }
[ -e /root/agent-only.txt ] && { echo "the agent's container is shared"; ok=0; }
[ -f /tests/verifier-image-marker ] || { echo "not the tests/Dockerfile image"; ok=0; }
echo $ok > /logs/verifier/reward.txt
"""


def test_separate_verifier_gets_only_the_artifacts(task_root, images, tmp_path):
    """`[verifier] environment_mode = "separate"` (the math-modeling tasks' form): the verifier runs in a
    container of tests/Dockerfile, which receives the declared artifacts (regular files and directories;
    symlinks skipped) and nothing else of the agent's container. The profile path refuses the mode."""
    from jaxrl.envs.harbor import HarborTaskError

    d = task_root / "separate-verifier"
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text(SEPARATE_TOML)
    (d / "instruction.md").write_text("Write /root/results/r.json.\n")
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN mkdir -p /root/results\nWORKDIR /root\n")
    (d / "tests" / "Dockerfile").write_text("FROM ubuntu:24.04\nCOPY . /tests/\n"
                                            "RUN touch /tests/verifier-image-marker && mkdir -p /logs/verifier\n")
    (d / "tests" / "test.sh").write_text(SEPARATE_TEST)  # mode 0644, as a checkout leaves it: chmodded as Harbor does
    (d / "solution" / "solve.sh").write_text(SEPARATE_SOLVE)
    with pytest.raises(HarborTaskError, match="separate verifier container needs the image backend"):
        load_task(d)
    task = load_task(d, environment_backend="auto")
    assert task.environment.profile == "image" and task.config.artifacts[0] == "/root/results/r.json"
    r = run_trial(task, config=TrialConfig(keep="all", images=images), trial_dir=tmp_path / "oracle",
                  agent=lambda trial: trial.run_oracle())
    out = (tmp_path / "oracle" / "verifier-env" / "logs" / "verifier" / "test-stdout.txt").read_text()
    assert (tmp_path / "oracle" / "verifier-env" / "logs" / "verifier" / "reward.txt").read_text().strip() == "1", out
    assert r.outcome == Outcome.OK and r.reward == 1.0, (r.error, out)
    assert r.info["artifacts"]["missing"] == [] and len(r.info["artifacts"]["skipped"]) == 2, r.info
    nop = run_trial(task, config=TrialConfig(keep="all", images=images), trial_dir=tmp_path / "nop",
                    agent=lambda trial: None)
    assert nop.outcome == Outcome.OK and nop.reward == 0.0, nop.error
    assert len(nop.info["artifacts"]["missing"]) == 3


def test_a_failing_build_is_one_clear_error(task_root, images, tmp_path):
    bad = write_task(task_root, "badbuild", dockerfile="FROM ubuntu:24.04\nRUN echo building && exit 3\n")
    r = run_trial(load_task(bad, environment_backend="image"), config=TrialConfig(keep="none", images=images),
                  trial_dir=tmp_path / "t")
    assert r.outcome == Outcome.SANDBOX_ERROR
    assert "task badbuild" in r.error and "STEP 2/2: RUN echo building && exit 3" in r.error, r.error
    assert "Traceback" not in r.error and "\n" not in r.error
    log_path = r.error.rsplit("(log: ", 1)[1].rstrip(")")
    assert "exit status 3" in Path(log_path).read_text()
    missing = write_task(task_root, "nobase", dockerfile="FROM python:3.99-nowhere\nRUN true\n")
    r = run_trial(load_task(missing, environment_backend="image"), config=TrialConfig(keep="none", images=images),
                  trial_dir=tmp_path / "t2")
    assert r.outcome == Outcome.SANDBOX_ERROR and "harbor.base_images" in r.error and "python:3.99-nowhere" in r.error


# ---------------------------------------------------------------------------------------------
# (b) reuse and hashing; (c) the LRU cap


class CountingBuilder(BuildahBuilder):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def build(self, *a, **kw):
        self.calls += 1
        return super().build(*a, **kw)


def _tiny(root: Path, name: str) -> Path:
    """A task whose image is the stand-in plus one unique file (builds in a few seconds)."""
    d = write_task(root, name, dockerfile=f"FROM {STAND_IN}\nCOPY data.txt /data.txt\n")
    (d / "environment" / "data.txt").write_text(f"{name} {uuid.uuid4().hex}\n")
    return d


def test_second_ensure_reuses_the_image_and_a_changed_file_changes_the_hash(task_root, images):
    d = _tiny(task_root, "reuse")
    task = load_task(d, environment_backend="image")
    b = CountingBuilder()
    cache = ImageCache(images, builder=b)
    ref = cache.ensure(task)
    assert b.calls == 1
    first = _image_id(ref)
    assert first and _cat(ref, "data.txt") == (d / "environment" / "data.txt").read_text()
    cache2 = ImageCache(images, builder=CountingBuilder())  # a new process's cache: same index, same store
    assert cache2.ensure(task) == ref and cache2.builder.calls == 0 and _image_id(ref) == first
    assert cache.index()[ref]["image_id"] == first
    h0 = context_hash(d / "environment", dict(BASE_MAP))
    (d / "environment" / "data.txt").write_text("changed\n")
    h1 = context_hash(d / "environment", dict(BASE_MAP))
    os.chmod(d / "environment" / "data.txt", 0o600)
    h2 = context_hash(d / "environment", dict(BASE_MAP))
    assert len({h0, h1, h2}) == 3
    assert context_hash(d / "environment", {}) != h2  # the base-image map is part of it
    _buildah("rmi", ref, check=False)


def test_a_base_rebuilt_under_the_same_name_gives_a_new_task_image(task_root, images):
    """Review of the first slice: the hash held the base's name, not its image, so a rebuilt stand-in
    kept serving task images built on the old one."""
    base = "localhost/jaxrl-test-base:1"
    _buildah("tag", STAND_IN, base)
    d = write_task(task_root, "rebased", dockerfile=f"FROM {base}\nCOPY data.txt /data.txt\n")
    cache = ImageCache(images)
    before = cache.tag_for(load_task(d, environment_backend="image"))
    c = _buildah("from", "--pull=never", "-q", STAND_IN)  # the same name, now another image
    try:
        _buildah("copy", c, str(d / "environment" / "data.txt"), "/rebuilt.txt")
        _buildah("commit", "-q", c, base)
    finally:
        _buildah("rm", c, check=False)
    assert _image_id(base) != _image_id(STAND_IN)
    after = cache.tag_for(load_task(d, environment_backend="image"))
    assert after != before
    assert after == image_tag(context_hash(d / "environment", dict(BASE_MAP), "buildah",
                                           base_ids={base: _image_id(base)}))
    _buildah("rmi", "-f", base, check=False)


def test_lru_cap_evicts_the_least_recently_used_and_keeps_the_one_in_use(task_root, images, tmp_path):
    images = ImageCacheConfig(base_images=BASE_MAP, cache_dir=str(tmp_path / "lru-cache"))  # only these images
    cache = ImageCache(images)
    refs = []
    for name in ("lru-a", "lru-b", "lru-c"):
        refs.append(cache.ensure(load_task(_tiny(task_root, name), environment_backend="image")))
        time.sleep(0.01)
    a, b, c = refs
    sizes = [cache.index()[r]["size"] for r in refs]
    assert all(s > 0 for s in sizes), sizes
    cache.acquire(a)  # a is the least recently used but in use
    cache._touch(c)
    small = ImageCache(ImageCacheConfig(base_images=BASE_MAP, cache_dir=images.cache_dir,
                                        max_mb=(sizes[0] + sizes[2]) // 10 ** 6 + 1), builder=cache.builder)
    small._in_use = cache._in_use  # the same process's containers
    removed = small.evict()
    assert removed == [b]
    assert _image_id(a) and _image_id(c) and not _image_id(b)
    cache.release(a)
    tiny = ImageCache(ImageCacheConfig(base_images=BASE_MAP, cache_dir=images.cache_dir,
                                       max_mb=sizes[2] // 10 ** 6 + 1))
    assert tiny.evict() == [a]
    assert _image_id(c) and not _image_id(a)
    assert set(tiny.index()) == {c}
    _buildah("rmi", c, check=False)


def test_artifacts_that_are_too_deep_or_too_big_do_not_crash_the_run(task_root, images, tmp_path):
    """Fresh-user review: an artifact directory nested 1,100 levels deep raised RecursionError out of `check`
    (the whole run died), and a 4 GB sparse file was copied in full twice with no cap. Now each trial's
    artifacts are copied within its storage and file limits and 128 levels; the verifier judges what came,
    and the trial records why the rest did not. The agent's /logs/artifacts reaches the verifier's."""
    d = task_root / "artifact-limits"
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text('artifacts = ["/app/deep", "/app/big"]\n[verifier]\nenvironment_mode = "separate"\n'
                                 '[environment]\nstorage_mb = 64\nmemory_mb = 512\nallow_internet = false\n')
    (d / "instruction.md").write_text("Make artifacts.\n")
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN mkdir -p /app\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n[ -f /logs/artifacts/note.txt ] && echo 1 > /logs/verifier/reward.txt "
                                         "|| echo 0 > /logs/verifier/reward.txt\n")
    (d / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nmkdir -p /app/deep && cd /app/deep && for i in $(seq 1 300); do mkdir d && cd d; done\n"
        "echo note > /logs/artifacts/note.txt\n")
    task = load_task(d, environment_backend="image")
    r = run_trial(task, config=TrialConfig(keep="logs", images=images), trial_dir=tmp_path / "deep",
                  agent=lambda trial: trial.run_oracle())
    assert r.outcome == Outcome.OK, r.error
    assert "nests directories deeper than 128" in r.info["artifacts"]["refused"], r.info
    assert r.reward == 0.0  # the deep artifact stopped the copy before the convention directory

    (d / "solution" / "solve.sh").write_text("#!/bin/bash\nmkdir -p /app/big && truncate -s 40M /app/big/a && truncate -s 40M /app/big/b\n"
                                             "echo note > /logs/artifacts/note.txt\n")
    big = run_trial(load_task(d, environment_backend="image"), config=TrialConfig(keep="logs", images=images),
                    trial_dir=tmp_path / "big", agent=lambda trial: trial.run_oracle())
    assert big.outcome == Outcome.OK and "storage limit (64 MB" in big.info["artifacts"]["refused"], big.info
    assert sum(f.stat().st_size for f in (tmp_path / "big").rglob("*") if f.is_file()) < 70 * 10 ** 6

    (d / "solution" / "solve.sh").write_text("#!/bin/bash\nmkdir -p /app/deep/a/b && echo x > /app/deep/a/b/x\n"
                                             "echo note > /logs/artifacts/note.txt\n")
    ok = run_trial(load_task(d, environment_backend="image"), config=TrialConfig(keep="logs", images=images),
                   trial_dir=tmp_path / "ok", agent=lambda trial: trial.run_oracle())
    assert ok.reward == 1.0 and "refused" not in ok.info["artifacts"], (ok.error, ok.info)


def test_a_killed_trial_process_leaves_no_container_behind(stand_in):
    """Regression: a trial process killed by a signal (SIGKILL, or SIGTERM with no handler) left its
    buildah container and writable layer behind for good. Containers carry their creator's pid; the
    next container made on the machine removes those of processes that ended, and only those."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"jaxrl-trial-{dead.pid}-deadbeef"
    live = f"jaxrl-trial-{os.getpid()}-cafef00d"
    for name in (stale, live):
        _buildah("from", "--pull=never", "-q", "--name", name, STAND_IN)
    b = BuildahBuilder()
    c, _ = b.create_container(STAND_IN)
    try:
        names = _buildah("containers", "--all", "--format", "{{.ContainerName}}").split()
        assert stale not in names and live in names, names
    finally:
        b.remove_container(c)
        _buildah("rm", live, check=False)


def test_check_builds_each_image_once_even_over_the_cap(task_root, tmp_path, caplog):
    """Regression (the public math-modeling run): `check` builds ahead, and with the run's images over the
    cache cap each later build evicted an earlier one, which its trials then rebuilt. The run's images are
    now pinned until it ends (one build each, a warning naming the cap), and the cap applies afterwards."""
    from jaxrl.envs.harbor import check_tasks

    images = ImageCacheConfig(base_images=BASE_MAP, cache_dir=str(tmp_path / "pin-cache"), max_mb=1)
    cache = image_cache(images)
    cache.builder = CountingBuilder()
    tasks = [load_task(_tiny(task_root, f"pin-{i}"), environment_backend="image") for i in range(2)]
    checks = check_tasks(tasks, config=TrialConfig(keep="none", images=images), concurrency=2)
    assert all(c.oracle is not None and c.oracle.reward == 0.0 for c in checks), [c.problems for c in checks]
    assert cache.builder.calls == 2  # each image once: no trial rebuilt an evicted one
    assert "over the image cache cap of 1 MB" in caplog.text
    assert cache.index() == {} and not any(_image_id(cache.tag_for(t)) for t in tasks)  # the cap, after the run


def test_the_trainer_builds_every_image_before_the_first_rollout(task_root, tmp_path):
    """Without the gate (data.verify_tasks=False) images were built lazily, at a task's first trial, while
    the other rollouts waited; now the env factory builds (and pins) every image first, and a task whose
    build fails is one ConfigError naming it."""
    import importlib.util

    from jaxrl.config import ConfigError
    from jaxrl.train.harbor import HarborTasks

    tasks = tmp_path / "set"
    for i in range(2):
        shutil.copytree(_tiny(task_root, f"ahead-{i}"), tasks / f"ahead-{i}")
    spec = importlib.util.spec_from_file_location("terminal_recipe", Path(__file__).parents[1] / "configs" / "terminal.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    c = recipe.get_config()
    c.data.dataset_path, c.data.verify_tasks = str(tasks), False
    c.data.eval_dataset_path, c.data.eval_fraction = "", 0.0
    c.harbor.environment_backend = "image"
    c.harbor.base_images = (f"{STAND_IN}={STAND_IN}",)
    c.harbor.image_cache_dir = str(tmp_path / "cache")
    h = HarborTasks(c)
    cache = image_cache(ImageCacheConfig(base_images=((STAND_IN, STAND_IN),), cache_dir=c.harbor.image_cache_dir))
    assert not any(_image_id(cache.tag_for(t)) for t in h.train_harbor + h.eval_harbor)
    h.make_env_factory(str(tmp_path / "run"))
    assert all(_image_id(cache.tag_for(t)) for t in h.train_harbor + h.eval_harbor)  # built before any trial
    assert not (tmp_path / "run" / "trials").exists()

    (tasks / "ahead-1" / "environment" / "Dockerfile").write_text(f"FROM {STAND_IN}\nRUN exit 3\n")
    h = HarborTasks(c)
    with pytest.raises(ConfigError, match="the image of task ahead-1 does not build") as e:
        h.make_env_factory(str(tmp_path / "run2"))
    assert "\n" not in str(e.value) and "data.verify_tasks=True" in str(e.value)


# ---------------------------------------------------------------------------------------------
# (d) the sandbox's guarantees on a built image

PROBES = r'''
import ctypes, json, os, platform, socket, sys
''' + PROBE_PRELUDE + r'''probe("read_host_secret", lambda: open(E["HOST_SECRET"]).read())
probe("read_other_trial", lambda: open(E["OTHER_TRIAL_FILE"]).read())
probe("read_host_storage", lambda: os.listdir("/var/lib/containers"))
probe("tests_visible", lambda: raise_if(os.path.exists("/tests"), os.listdir("/tests")))
probe("solution_visible", lambda: raise_if(os.path.exists("/solution"), os.listdir("/solution")))
probe("verifier_logs_visible", lambda: raise_if(os.path.exists("/logs/verifier"), "exists"))
def write(p):
    with open(p, "w") as f: f.write("x")
    return "wrote " + p
probe("write_opt_jaxrl", lambda: write("/opt/jaxrl/bashrc"))
probe("write_dev", lambda: write("/dev/escape"))
probe("write_sysrq", lambda: write("/proc/sysrq-trigger"))
probe("write_proc_sys", lambda: write("/proc/sys/kernel/hostname"))
libc = ctypes.CDLL(None, use_errno=True)
def call(rc_fn):
    if rc_fn() != 0: raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "succeeded"
probe("unshare_user", lambda: call(lambda: libc.unshare(0x10000000)))
probe("unshare_net", lambda: call(lambda: libc.unshare(0x40000000)))
probe("mount_tmpfs", lambda: call(lambda: libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)))
def caps():
    st = open("/proc/self/status").read()
    eff = [l for l in st.splitlines() if l.startswith("CapEff")][0].split()[1]
    nnp = [l for l in st.splitlines() if l.startswith("NoNewPrivs")][0].split()[1]
    return raise_if(int(eff, 16) != 0 or nnp != "1", (eff, nnp))
probe("capabilities", caps)
def host_pid():
    os.kill(int(E["HOST_PID"]), 0); return "host pid visible"
probe("signal_host_pid", host_pid)
probe("sys_cgroupfs", lambda: raise_if(os.path.exists("/sys/fs/cgroup") or os.path.exists("/sys/kernel"), "sys"))
def fds():
    open_fds = sorted(int(x) for x in os.listdir("/proc/%d/fd" % os.getppid()))
    return raise_if(any(fd > 2 for fd in open_fds), open_fds)
probe("leaked_fds", fds)
col = 0 if platform.machine() == "x86_64" else 1
libc.syscall.restype = ctypes.c_long
def sysc(nums, *args):
    return call(lambda: 0 if libc.syscall(nums[col], *args) >= 0 else 1)
probe("seccomp_ptrace_attach", lambda: sysc((101, 117), 16, 1, 0, 0))
probe("seccomp_keyctl", lambda: sysc((250, 219), 0, ctypes.c_long(-4), 0))
probe("seccomp_bpf", lambda: sysc((321, 280), 0, 0, 0))
probe("seccomp_io_uring", lambda: sysc((425, 425), 1, ctypes.create_string_buffer(120)))
probe("seccomp_open_by_handle", lambda: sysc((304, 265), ctypes.c_int(-100), ctypes.create_string_buffer(64), 0))
with open("/root/escape-probe", "w") as f: f.write("in the layer")
print("UID", os.getuid(), "CWD", os.getcwd())
print("PROBES" + json.dumps(res))
'''


def _host_ip() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.2"
    finally:
        s.close()


@pytest.mark.parametrize("builder", ["buildah", "podman"])
def test_escape_attempts_are_blocked_on_a_built_image(task_root, images, tmp_path, builder):
    """27 in-sandbox probes on the container while a second trial of the same image is live; writes to /
    land in the container's own layer; the layer is gone after close. Once per builder (the builder makes
    the image and the container's root; bwrap runs the commands either way)."""
    import dataclasses

    if builder == "podman" and shutil.which("podman") is None:
        pytest.fail("podman is not installed (apt-get install podman; .ci/run installs it)")
    images = dataclasses.replace(images, builder=builder)
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    hits = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                hits.append(listener.accept()[0].close())
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    abstract = f"jaxrl-img-test-{os.getpid()}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract)
    unix.listen(8)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    d = write_task(task_root, f"escape-{builder}")
    (d / "environment" / "data.txt").write_text(uuid.uuid4().hex)  # a new image: built by `builder` here
    task = load_task(d, environment_backend="image")
    cfg = TrialConfig(images=images)
    other = Trial(task, tmp_path / "other", cfg).start()
    trial = Trial(task, tmp_path / "probe", cfg).start()
    try:
        assert isinstance(trial.sandbox, ImageSandbox)
        other.exec("echo other > /workspace/other.txt")
        other_file = Path(other.sandbox.rootfs) / "workspace" / "other.txt"
        assert other_file.read_text() == "other\n"  # the path the probe tries exists on the host
        env = {"HOST_PORT": str(listener.getsockname()[1]), "HOST_IP": _host_ip(), "ABSTRACT": abstract,
               "HOST_SECRET": str(secret), "OTHER_TRIAL_FILE": str(other_file), "HOST_PID": str(os.getpid())}
        r = trial.exec("python3 - <<'EOF'\n" + PROBES + "EOF", timeout=60, env=env)
        line = [ln for ln in r.output.splitlines() if ln.startswith("PROBES")]
        assert line, r.output
        res = json.loads(line[0][len("PROBES"):])
        assert len(res) == 27
        escaped = {k: v for k, v in res.items() if not v.startswith("blocked")}
        assert not escaped, escaped
        assert not hits
        assert "UID 0 CWD /workspace" in r.output  # root of the image, in its WORKDIR
        layer = Path(trial.sandbox.layer)
        assert (layer / "root" / "escape-probe").read_text() == "in the layer"
        assert not os.path.exists("/root/escape-probe")
        assert not (Path(other.sandbox.rootfs) / "root" / "escape-probe").exists()
        container = trial.sandbox.container
    finally:
        stop.set()
        listener.close()
        unix.close()
        trial.close()
        other.close()
    assert not layer.exists()
    assert container not in _buildah("containers", "--all", "--quiet", "--notruncate")
    tag = image_cache(images).tag_for(task)
    log = Path(images.cache_dir) / "logs" / f"{tag.rsplit(':', 1)[1]}.log"
    assert log.read_text().startswith(f"$ {builder} {'build' if builder == 'podman' else 'bud'} "), log.read_text()[:200]
    if builder == "podman":
        assert container not in subprocess.run(["podman", "ps", "--all", "--external", "--quiet", "--no-trunc"],
                                               capture_output=True, text=True).stdout


CGROUP = [(n, c) for n, c in limit_configs() if n == "cgroup"]


@pytest.mark.skipif(not CGROUP, reason="the image backend's limits need writable cgroups on this host")
def test_limits_hold_on_a_built_image(task_root, images, tmp_path):
    """Fork bomb (process cap), memory bomb (cgroup memory), one big file (RLIMIT_FSIZE) and many small
    files in the container's layer (disk monitor); the trial still verifies."""
    import dataclasses

    # one file stops at RLIMIT_FSIZE (32 MB) below the disk limit (64 MB), so the monitor does not race it
    config = dataclasses.replace(CGROUP[0][1], max_file_size_mb=32)
    task = load_task(write_task(task_root, "limits", storage_mb=64, memory_mb=256), environment_backend="image")

    def agent(trial):
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(sum(len(descendants(p.pid)) for p in list(trial.sandbox._procs)))
                time.sleep(0.05)

        th = threading.Thread(target=sample)
        th.start()
        r = trial.exec("bomb() { bomb | bomb & }; bomb; sleep 10", timeout=4)
        stop.set()
        th.join()
        assert r.timed_out
        trial.info["max_procs"] = max(samples)
        r = trial.exec("awk 'BEGIN { s = \"xxxxxxxxxxxxxxxx\"; while (1) { s = s s; print length(s); fflush() } }'",
                       timeout=30)
        sizes = [int(x) for x in r.output.split() if x.isdigit()]
        assert sizes and max(sizes) <= 256 << 20 and r.limit == "memory", r.output[-300:]
        r = trial.exec("dd if=/dev/zero of=/workspace/big bs=1M count=500 2>&1; echo rc=$?", timeout=30)
        assert os.path.getsize(Path(trial.sandbox.layer) / "workspace" / "big") == 32 << 20
        assert "rc=153" in r.output or "File size limit" in r.output, r.output
        r = trial.exec("rm /workspace/big; echo rm=$?")
        assert "rm=0" in r.output and not (Path(trial.sandbox.layer) / "workspace" / "big").exists(), r
        r = trial.exec("for i in $(seq 500); do head -c 1048576 /dev/zero > /root/f$i || break; done", timeout=60)
        assert r.limit == "disk" and r.exit_code is None, r
        trial.info["disk_mb_at_kill"] = trial.sandbox.disk_usage()[0] >> 20
        trial.info["layer_mb"] = sum(p.stat().st_size for p in (Path(trial.sandbox.layer) / "root").glob("f*")) >> 20

    r = run_trial(task, agent, config=TrialConfig(sandbox=config, images=images), trial_dir=tmp_path / "trial")
    assert r.outcome == Outcome.OK and r.reward == 0.0, r.error
    assert 32 <= r.info["max_procs"] <= config.max_processes + 1, r.info
    assert r.limits_hit.get("pids", 0) >= 1 and r.limits_hit.get("memory") == 1 and r.limits_hit.get("disk") == 1
    assert 64 <= r.info["layer_mb"] <= r.info["disk_mb_at_kill"] < 64 + 400, r.info


def test_host_uid_and_unsafe_backend_are_refused(task_root, images, tmp_path):
    task = load_task(write_task(task_root, "refused"), environment_backend="image")
    for sb, word in ((SandboxConfig(limits_backend="rlimit", host_uid=65534), "host_uid"),
                     (SandboxConfig(backend="UNSAFE_host_no_isolation"), "needs bwrap")):
        if sb.host_uid is not None and os.geteuid() != 0:
            continue
        with pytest.raises(SandboxError, match=word):
            Trial(task, tmp_path / word.replace(" ", "_"), TrialConfig(sandbox=sb, images=images)).start()


def test_a_build_never_retags_a_shared_name(task_root, images):
    """The fresh-user review: mapping FROM ubuntu:24.04 retagged docker.io/library/ubuntu:24.04 in the
    shared image store, so later unmapped builds (and other processes' maps) used the last mapping."""
    name = f"jaxrl-test-base-{uuid.uuid4().hex[:8]}:1"  # a name only this test uses
    mapped = ImageCacheConfig(base_images=BASE_MAP + ((name, STAND_IN),), cache_dir=images.cache_dir)
    d = write_task(task_root, "no-retag", dockerfile=f"FROM {name}\nCOPY data.txt /data.txt\n")
    (d / "environment" / "data.txt").write_text(f"no-retag {uuid.uuid4().hex}\n")
    ref = ImageCache(mapped).ensure(load_task(d, environment_backend="image"))
    assert _cat(ref, "data.txt") == (d / "environment" / "data.txt").read_text()
    assert _image_id(f"docker.io/library/{name}") == "" and _image_id(name) == ""  # no tag was made
    _buildah("rmi", ref, check=False)
    _buildah("rmi", f"docker.io/library/{name}", check=False)


def test_auto_gives_a_task_with_only_a_prebuilt_image_that_image(task_root):
    """The fresh-user review: under auto, `[environment] docker_image = "ubuntu:22.04"` without a
    Dockerfile ran on the host's shell profile instead of the image."""
    d = write_task(task_root, "prebuilt-only")
    (d / "environment" / "Dockerfile").unlink()
    (d / "task.toml").write_text((d / "task.toml").read_text() + 'docker_image = "ubuntu:22.04"\n')
    assert load_task(d, environment_backend="auto").environment.profile == "image"
    assert load_task(d, environment_backend="profile").environment.profile == "shell"  # the profile path's reading
