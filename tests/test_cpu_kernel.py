"""The rollout engine's CPU kernel (jaxrl/models/cpu_kernel.py, panel_matmul.cc): values against
float64 numpy, the panel layout by hand, its errors, the build cache and the fallback when it
cannot be built."""
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.models import cpu_kernel, qwen3, qwen3_engine
from jaxrl.rollout.sampler import Sampler
from jaxrl.rollout.types import SamplingParams


def test_to_panels_puts_16_output_columns_in_each_panel():
    w = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)  # [in 3, out 40]: 3 panels, the last half empty
    p = np.asarray(cpu_kernel.to_panels(jnp.asarray(w)))
    assert p.shape == (3, 3, 16)
    for k in range(3):
        for n in range(48):
            assert p[n // 16, k, n % 16] == (w[k, n] if n < 40 else 0.0), (k, n)


@pytest.mark.parametrize("K,N", [(256, 512), (96, 48), (7, 16), (33, 40), (5, 3)])
def test_panel_matmul_against_float64(K, N):
    """Every row count the engine runs (1-16 rows in a decode step, more in a prefill), odd
    inner sizes, and a last panel only partly used (N not a multiple of 16): within float32's
    round-off bound, K 2^-24 sum_k |x w|, of a float64 numpy matmul."""
    rng = np.random.default_rng(K * N)
    w = rng.standard_normal((K, N)).astype(np.float32)
    wp = cpu_kernel.to_panels(jnp.asarray(w))
    f = jax.jit(cpu_kernel.panel_matmul, static_argnums=2)
    for M in (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 40):
        x = rng.standard_normal((M, K)).astype(np.float32)
        got = np.asarray(f(jnp.asarray(x), wp, N))
        want = x.astype(np.float64) @ w.astype(np.float64)
        bound = K * 2.0 ** -24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))
        assert got.shape == (M, N) and got.dtype == np.float32
        assert np.all(np.abs(got - want) <= bound), (M, np.max(np.abs(got - want) / bound))
        # Each output is one thread's sum in k order: repeated calls agree bit for bit.
        assert np.array_equal(np.asarray(f(jnp.asarray(x), wp, N)), got)


def test_panel_matmul_inside_a_loop_and_with_an_empty_batch():
    """The custom call inside a jitted while loop (as in the decode loop) gives the loop of the
    float64 reference; zero rows give an empty result."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    wp = cpu_kernel.to_panels(jnp.asarray(w))
    got = jax.jit(lambda x, wp: jax.lax.fori_loop(0, 5, lambda i, c: jnp.tanh(cpu_kernel.panel_matmul(c, wp, 64)),
                                                   x))(jnp.asarray(x), wp)
    want = x.astype(np.float64)
    for _ in range(5):
        want = np.tanh(want @ w.astype(np.float64))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)
    assert jax.jit(cpu_kernel.panel_matmul, static_argnums=2)(jnp.zeros((0, 64)), wp, 64).shape == (0, 64)


def test_panel_matmul_refuses_mismatched_shapes_and_dtypes():
    wp = cpu_kernel.to_panels(jnp.zeros((32, 48), jnp.float32))  # [3, 32, 16]
    with pytest.raises(ValueError, match="do not multiply"):
        cpu_kernel.panel_matmul(jnp.zeros((2, 31), jnp.float32), wp, 48)
    with pytest.raises(ValueError, match="do not multiply"):
        cpu_kernel.panel_matmul(jnp.zeros((2, 32), jnp.float32), wp, 32)  # needs 33..48 columns
    with pytest.raises(ValueError, match="float32 only"):
        cpu_kernel.panel_matmul(jnp.zeros((2, 32), jnp.bfloat16), wp, 48)


def test_build_is_cached_and_a_damaged_copy_is_built_again(tmp_path, monkeypatch):
    """A fresh cache directory gets one library, readable by other users of a shared cache; the
    second build finds it (no compile), and no temporary file is left behind. A cached library
    cut short on disk (not by our atomic write; loading it could crash the process) no longer
    matches the hash in its name: it is removed and built again."""
    monkeypatch.setenv("JAXRL_CACHE_DIR", str(tmp_path))
    path = cpu_kernel.build()
    assert path.parent == tmp_path / "kernels" and path.exists() and path.stat().st_mode & 0o777 == 0o755
    mtime = path.stat().st_mtime_ns
    monkeypatch.setenv("CXX", "/nonexistent/c++")  # a second compile would fail
    assert cpu_kernel.build() == path and path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    monkeypatch.delenv("CXX")
    good = path.read_bytes()
    with open(path, "r+b") as f:
        f.truncate(len(good) // 3)
    assert cpu_kernel.build() == path and path.read_bytes() == good
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_no_compiler_warns_and_falls_back_or_fails_when_required(tmp_path, monkeypatch):
    """Without a compiler: under the default ("auto") one warning naming the compiler and the
    fix, and a CPU engine then runs XLA's kernels ("out_in"); JAXRL_CPU_KERNEL=1 makes it an
    error; 0 never builds; any other value is refused."""
    cfg = qwen3.Qwen3Config.preset("tiny")
    monkeypatch.setenv("JAXRL_CACHE_DIR", str(tmp_path))  # nothing built here
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr(cpu_kernel, "_state", {})  # as in a process that has not registered it
    monkeypatch.delenv("JAXRL_CPU_KERNEL", raising=False)
    with pytest.warns(RuntimeWarning, match=r"no C\+\+ compiler '/nonexistent/c\+\+'.*JAXRL_CPU_KERNEL=0"):
        assert qwen3_engine.engine_layout("cpu", 8, cfg) == "out_in"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process
        assert qwen3_engine.engine_layout("cpu", 8, cfg) == "out_in"
        assert qwen3_engine.engine_layout("cpu", 1, cfg) == "in_out"
    monkeypatch.setenv("JAXRL_CPU_KERNEL", "1")
    with pytest.raises(cpu_kernel.KernelBuildError, match="no C\\+\\+ compiler"):
        qwen3_engine.engine_layout("cpu", 8, cfg)
    monkeypatch.setenv("JAXRL_CPU_KERNEL", "0")
    assert qwen3_engine.engine_layout("cpu", 8, cfg) == "out_in" and not list(tmp_path.rglob("*.so"))
    monkeypatch.setenv("JAXRL_CPU_KERNEL", "yes")
    with pytest.raises(ValueError, match="JAXRL_CPU_KERNEL='yes'"):
        qwen3_engine.engine_layout("cpu", 8, cfg)
    with pytest.raises(ValueError, match="JAXRL_CPU_KERNEL='yes'"):  # every CPU engine checks it
        qwen3_engine.engine_layout("cpu", 64, cfg)
    monkeypatch.setenv("JAXRL_CPU_KERNEL", "")  # empty is unset: auto
    assert cpu_kernel.mode() == "auto"


def _fake_compiler(tmp_path, body: str):
    """A stand-in for c++: a script that writes `body` (Python bytes literal) to its -o file and
    records its arguments."""
    fake = tmp_path / "fake-cxx"
    fake.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
open({str(tmp_path / 'args')!r}, 'a').write(' '.join(args) + '\\n')
out = args[args.index('-o') + 1]
open(out, 'wb').write({body})
""")
    fake.chmod(0o755)
    return fake


def test_a_compiler_that_writes_nothing_or_cannot_run_is_refused(tmp_path, monkeypatch):
    """A compiler that exits 0 but writes no library, and a CXX that is not a program, are one
    KernelBuildError each (a fallback warning under "auto"); nothing is cached."""
    monkeypatch.setenv("JAXRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(_fake_compiler(tmp_path, "b''")))
    with pytest.raises(cpu_kernel.KernelBuildError, match="succeeded but wrote no library"):
        cpu_kernel.build()
    monkeypatch.setenv("CXX", str(tmp_path))  # a directory
    with pytest.raises(cpu_kernel.KernelBuildError, match="cannot run the C\\+\\+ compiler"):
        cpu_kernel.build()
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []


def test_a_library_that_does_not_load_falls_back_and_is_not_kept(tmp_path, monkeypatch):
    """A "library" that does not load (here: not an ELF file; in life, built against other
    system libraries) is removed from the cache, and "auto" warns and runs XLA's kernels, so the
    next process, its cause fixed, builds again. CXX may carry arguments."""
    monkeypatch.setenv("JAXRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", f"{_fake_compiler(tmp_path, repr(b'not a library'))} --extra-arg")
    monkeypatch.setattr(cpu_kernel, "_state", {})
    monkeypatch.delenv("JAXRL_CPU_KERNEL", raising=False)
    cfg = qwen3.Qwen3Config.preset("tiny")
    with pytest.warns(RuntimeWarning, match="does not load"):
        assert qwen3_engine.engine_layout("cpu", 8, cfg) == "out_in"
    assert qwen3_engine.engine_layout("cpu", 4, cfg) == "out_in"  # not tried again in this process
    calls = (tmp_path / "args").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("--extra-arg -O3")
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []
    monkeypatch.setenv("JAXRL_CPU_KERNEL", "1")
    with pytest.raises(cpu_kernel.KernelBuildError, match="does not load"):
        cpu_kernel.available()


def test_bad_cxx_and_an_unreadable_cache_entry_are_one_error(tmp_path, monkeypatch):
    """A CXX that does not split (an unclosed quote) and a cache entry that cannot be read (here
    a directory with a library's name) are KernelBuildErrors naming the fix, before anything is
    written; a blank CXX is the default compiler; `python -m jaxrl.models.cpu_kernel` says a
    failure in one line and exits 1."""
    monkeypatch.setenv("JAXRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", 'g++ "')
    with pytest.raises(cpu_kernel.KernelBuildError, match="CXX='g\\+\\+ \"' is not a command line"):
        cpu_kernel.build()
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv("CXX", "   ")
    assert cpu_kernel._compiler() == ["c++"]
    monkeypatch.delenv("CXX")
    key = cpu_kernel._key()
    (tmp_path / "cache" / "kernels" / f"panel_matmul-{key}-0000000000000000.so").mkdir(parents=True)
    with pytest.raises(cpu_kernel.KernelBuildError, match="cannot read or clean the cache"):
        cpu_kernel.build()
    env = dict(os.environ, CXX="/nonexistent/c++", JAXRL_CACHE_DIR=str(tmp_path / "cache2"))
    res = subprocess.run([sys.executable, "-m", "jaxrl.models.cpu_kernel"], env=env, capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and res.stderr.startswith("error: CPU kernel: no C++")


def test_long_prefills_use_xla_on_the_panels():
    """Up to KERNEL_MAX_ROWS rows a "panels" projection is the custom call, above it an XLA dot on
    the same panels; both within float32 round-off of float64 numpy."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 48)).astype(np.float32)
    p = {"w_p": cpu_kernel.to_panels(jnp.asarray(w))}
    f = jax.jit(lambda x, p: qwen3_engine._project(x, p, "w"))
    for rows, custom in ((cpu_kernel.KERNEL_MAX_ROWS, True), (cpu_kernel.KERNEL_MAX_ROWS + 1, False)):
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        assert (cpu_kernel.TARGET in f.lower(x, p).as_text()) == custom
        want = x.astype(np.float64) @ w.astype(np.float64)
        bound = 96 * 2.0 ** -24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))
        assert np.all(np.abs(np.asarray(f(x, p), np.float64) - want) <= bound)


def test_a_failed_compile_names_the_command_and_the_fix(tmp_path, monkeypatch):
    fake = tmp_path / "cxx"
    fake.write_text("#!/bin/sh\necho 'error: no room' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAXRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(cpu_kernel.KernelBuildError, match=r"(?s)failed:\nerror: no room\n.*JAXRL_CPU_KERNEL=0"):
        cpu_kernel.build()
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []  # no library, no temporary file


def test_layout_choice():
    """Panels on CPU for 1-16 rows of a float32 model whose widths are multiples of 16; XLA's
    layouts otherwise."""
    cfg = qwen3.Qwen3Config.preset("tiny")
    assert [qwen3_engine.engine_layout("cpu", r, cfg) for r in (1, 8, 16, 17)] == ["panels"] * 3 + ["in_out"]
    assert qwen3_engine.engine_layout("gpu", 8, cfg) == "in_out"
    bf16 = qwen3.Qwen3Config.preset("tiny", dtype="bfloat16")
    odd = qwen3.Qwen3Config.preset("tiny", vocab_size=250)
    for c in (bf16, odd):
        assert not qwen3_engine.panels_fit(c) and qwen3_engine.engine_layout("cpu", 8, c) == "out_in"
        with pytest.raises(ValueError, match="layout 'panels' needs float32"):
            qwen3_engine.engine_params({}, c, layout="panels")  # refused before any weight is read


def test_panels_engine_matches_the_xla_layout_with_a_tied_head():
    """Whole generations (prefill, shared-prompt decode, the head as a panel copy of the
    embedding) of a tied model: the panels layout gives the tokens of the "in_out" layout,
    logprobs within float32 round-off (untied: tests/test_sampler.py)."""
    tied = True
    cfg = qwen3.Qwen3Config.preset("tiny", tie_word_embeddings=tied)
    params = jax.tree.map(lambda x: x * 2.0 if x.ndim > 1 else x, qwen3.init_params(cfg, seed=1))
    kw = dict(max_seq_len=32, batch_buckets=(4,), prompt_buckets=(16,), new_token_buckets=(16,))
    a, b = Sampler(params, cfg, **kw), Sampler(params, cfg, **kw, layout="in_out")
    assert a.layout == "panels" and ("head_p" in a.params) == tied
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5]]
    sp = SamplingParams(max_tokens=12, temperature=1.0, n=2, seed=5)  # greedy: tests/test_sampler.py
    for ga, gb in zip(a.generate(prompts, sp), b.generate(prompts, sp)):
        for ca, cb in zip(ga, gb):
            assert ca.token_ids == cb.token_ids
            np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=1e-5, rtol=0)
