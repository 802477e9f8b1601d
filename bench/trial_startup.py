"""Per-trial start-up: the image backend against the profile path, side by side, on the same task.

One small task (FROM ubuntu:24.04, WORKDIR /app) loads on both paths: the profile path (host
directories on bubblewrap) and the image backend with each builder installed (buildah, podman: its
image built once, then a fresh container per trial). For each path, alternating, `--trials` times: `Trial.start()` (sandbox,
container, cgroup), one command (`true`, the first command an agent sends) and `close()`; printed per
path: the median, min and max of start (start() + first command) and of close, the ratio of the
medians, and the one-off build time of the image (its first `ensure`). The machine's load average is
printed with them; timings on shared cores swing with load, so read the ratio.

Usage: python bench/trial_startup.py [--trials 10] [--base-image ubuntu:24.04=localhost/debian-stand-in:bookworm]
(the stand-in: launch/make_base_stand_ins.sh).
"""
from __future__ import annotations

import argparse
import shutil
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxrl.config import base_image_pairs  # noqa: E402
from jaxrl.envs.harbor import Trial, TrialConfig, load_task  # noqa: E402
from jaxrl.envs.harbor.image_cache import ImageCacheConfig, image_cache  # noqa: E402

TOML = """[task]
name = "bench/startup"
[agent]
timeout_sec = 60
[verifier]
timeout_sec = 30
[environment]
memory_mb = 512
storage_mb = 256
allow_internet = false
"""


def write_task(root: Path) -> Path:
    d = root / "startup"
    for sub in ("environment", "tests"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text(TOML)
    (d / "instruction.md").write_text("Nothing.\n")
    (d / "environment" / "Dockerfile").write_text(f"FROM ubuntu:24.04\nWORKDIR /app\n# bench {time.time_ns()}\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    os.chmod(d / "tests" / "test.sh", 0o755)
    return d


def one(task, config: TrialConfig, root: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    trial = Trial(task, root, config).start()
    r = trial.exec("true")
    t1 = time.perf_counter()
    trial.close()
    t2 = time.perf_counter()
    if r.exit_code != 0:
        raise SystemExit(f"the first command failed on {task.environment.profile}: {r.output[:300]}")
    return t1 - t0, t2 - t1


def stats(xs: list) -> str:
    return f"median {statistics.median(xs):6.3f} s  (min {min(xs):.3f}, max {max(xs):.3f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--base-image", action="append", default=None, metavar="NAME=LOCAL")
    args = p.parse_args()
    base = base_image_pairs(args.base_image or ["ubuntu:24.04=localhost/debian-stand-in:bookworm"])
    work = Path(tempfile.mkdtemp(prefix="jaxrl-bench-startup-"))
    d = write_task(work)
    paths = {"profile": (load_task(d), TrialConfig(keep="none"))}
    builds = {}
    for builder in ("buildah", "podman"):
        if shutil.which(builder) is None:
            print(f"{builder} is not installed: its path is left out (apt-get install {builder})")
            continue
        images = ImageCacheConfig(base_images=base, cache_dir=str(work / "cache"), builder=builder)
        task = load_task(d, environment_backend="image")
        t0 = time.perf_counter()
        image_cache(images).ensure(task)
        builds[builder] = time.perf_counter() - t0
        paths[builder] = (task, TrialConfig(keep="none", images=images))
    res = {k: ([], []) for k in paths}
    for i in range(args.trials):
        for k, (task, config) in paths.items():
            s, c = one(task, config, work / f"{k}-{i}")
            res[k][0].append(s)
            res[k][1].append(c)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {args.trials} trials per path, alternating")
    for k, b in builds.items():
        print(f"image build with {k} (once, then cached): {b:.1f} s")
    for k, (task, _) in paths.items():
        print(f"{k:>7} ({task.environment.profile}): start+first command {stats(res[k][0])};  close {stats(res[k][1])}")
    for k in builds:
        ratio = statistics.median(res[k][0]) / statistics.median(res["profile"][0])
        print(f"{k} image / profile start-up (medians): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
