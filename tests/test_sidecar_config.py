"""Run-level sidecar settings: the logprob definition per run (generator.logprobs_mode) and the GPU
memory shares of the processes on one GPU (jaxrl/gpu_memory.py)."""
import pytest

from jaxrl import config as config_lib
from jaxrl import gpu_memory
from config_helpers import with_keys
from jaxrl.config import ConfigError


# --- logprob definition -------------------------------------------------------------------------

def test_unknown_logprobs_mode_is_refused():
    with pytest.raises(ConfigError, match="generator.logprobs_mode"):
        config_lib.validate(with_keys(**{"generator.logprobs_mode": "unprocessed"}), check_inputs=False)


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 0.9, -1), (0.7, 1.0, -1), (1.0, 1.0, 20), (0.6, 1.0, -1)])
def test_vllm_full_logprobs_accepted_where_a_vllm_mode_delivers_them(temperature, top_p, top_k):
    c = with_keys(**{"generator.backend": "vllm", "generator.sampling_params.temperature": temperature,
                "generator.sampling_params.top_p": top_p, "generator.sampling_params.top_k": top_k,
                "trainer.algorithm.temperature": temperature})
    config_lib.validate(c, check_inputs=False)


def test_vllm_full_logprobs_refused_at_temperature_with_top_p():
    # processed_logprobs renormalise over the top-p set; raw_logprobs ignore the temperature.
    c = with_keys(**{"generator.backend": "vllm", "generator.sampling_params.temperature": 0.7,
                "generator.sampling_params.top_p": 0.9, "trainer.algorithm.temperature": 0.7})
    with pytest.raises(ConfigError) as e:
        config_lib.validate(c, check_inputs=False)
    msg = str(e.value)
    assert msg.startswith("config key `generator.logprobs_mode`") and "temperature=0.7" in msg and "top_p=0.9" in msg
    assert "generator.logprobs_mode=sampled" in msg and len(msg.splitlines()) == 1


@pytest.mark.parametrize("backend", ["jax", "vllm"])
def test_sampled_logprobs_are_deliverable_at_any_setting(backend):
    # The JAX engine serves either mode per request; vLLM's processed_logprobs are the sampled ones.
    c = with_keys(**{"generator.backend": backend, "generator.logprobs_mode": "sampled",
                "generator.sampling_params.temperature": 0.7, "generator.sampling_params.top_p": 0.9,
                "generator.sampling_params.top_k": 20, "trainer.algorithm.temperature": 0.7})
    config_lib.validate(c, check_inputs=False)


def test_vllm_non_greedy_eval_must_match_the_trainings_vllm_mode():
    # Training at T=1 with top_p 0.9 needs raw_logprobs, which cannot give full logprobs at T=0.7.
    c = with_keys(**{"generator.backend": "vllm", "generator.sampling_params.top_p": 0.9,
                "generator.eval_sampling_params.greedy": False, "generator.eval_sampling_params.temperature": 0.7})
    with pytest.raises(ConfigError, match="generator.eval_sampling_params.temperature"):
        config_lib.validate(c, check_inputs=False)


def test_logprobs_mode_is_recorded_in_rl_config_json():
    assert config_lib.to_json_dict(with_keys())["generator"]["logprobs_mode"] == "full"


# --- GPU memory shares ----------------------------------------------------------------------------

def test_default_shares_fit_and_cpu_runs_are_not_held_to_them():
    config_lib.validate(with_keys(), check_inputs=False, platform="gpu")  # 0.6 + 0.3
    config_lib.validate(with_keys(**{"trainer.gpu_memory_fraction": 0.9}), check_inputs=False, platform="cpu")


@pytest.mark.parametrize("overrides,listing,total", [
    ({"trainer.gpu_memory_fraction": 0.7}, "0.70 trainer (trainer.gpu_memory_fraction) + 0.30 JAX sidecar 0", "1.00"),
    ({"generator.num_sidecars": 2}, "0.60 trainer (trainer.gpu_memory_fraction) + 0.30 JAX sidecar 0 "
                                    "(generator.gpu_memory_utilization) + 0.30 JAX sidecar 1", "1.20"),
    ({"generator.backend": "vllm", "generator.colocate_with_trainer": True, "trainer.gpu_memory_fraction": 0.55,
      "generator.gpu_memory_utilization": 0.45}, "0.55 trainer (trainer.gpu_memory_fraction) + 0.45 vLLM sidecar",
     "1.00"),
])
def test_shares_that_exceed_a_gpu_are_refused_with_the_numbers(overrides, listing, total):
    with pytest.raises(ConfigError) as e:
        config_lib.validate(with_keys(**overrides), check_inputs=False, platform="gpu")
    msg = str(e.value)
    assert listing in msg and f"= {total} of its memory, more than 0.95" in msg, msg


def test_split_and_colocated_8b_layouts_fit():
    c = config_lib.base_config()
    config_lib.apply_scale(c, "qwen3_8b")
    assert gpu_memory.claims(c) == [("trainer (trainer.gpu_memory_fraction)", 0.9)]  # vLLM on its own nodes
    gpu_memory.check_shares(c)
    c.generator.colocate_with_trainer = True
    for trainer, engine in ((0.55, 0.35), (0.70, 0.25)):  # docs/cluster.md "GPU memory": colocated on H200s, on GH200s
        c.trainer.gpu_memory_fraction, c.generator.gpu_memory_utilization = trainer, engine
        gpu_memory.check_shares(c)


@pytest.mark.parametrize("key,value", [("trainer.gpu_memory_fraction", 0.0), ("trainer.gpu_memory_fraction", 1.0),
                                       ("generator.gpu_memory_utilization", 1.5)])
def test_share_outside_zero_one_is_refused_on_any_platform(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_lib.validate(with_keys(**{key: value}), check_inputs=False)


def test_processes_get_their_share_in_the_environment():
    c = with_keys(**{"trainer.gpu_memory_fraction": 0.55, "generator.gpu_memory_utilization": 0.35})
    env = {}
    gpu_memory.apply_trainer_env(c, env)
    assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.55", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    assert gpu_memory.sidecar_env(c) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.35",
                                         "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    gpu_memory.apply_trainer_env(c, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.55"})  # the same value is fine
    with pytest.raises(ConfigError, match="XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 in the environment disagrees"):
        gpu_memory.apply_trainer_env(c, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})


def test_main_refuses_a_conflicting_memory_fraction_in_one_line(tmp_path, monkeypatch, capsys):
    """jaxrl.main's `main` in process (tests/main_in_process.py) with the variable set in its environment."""
    from main_in_process import recipe, run_main

    code, err = run_main(monkeypatch, capsys, recipe("configs/rloo.py"), tmp_path / "run",
                         env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
    assert code == 2 and err.strip().count("\n") == 0, err
    assert "trainer.gpu_memory_fraction" in err and not (tmp_path / "run").exists()


def test_colocated_external_sidecars_must_report_the_configured_share():
    c = with_keys(**{"generator.backend": "vllm", "generator.sidecar_urls": ("http://a",),
                "generator.colocate_with_trainer": True, "generator.gpu_memory_utilization": 0.35})
    gpu_memory.check_external_sidecars(c, {"http://a": {"gpu_memory": {"vllm_gpu_memory_utilization": 0.35}}})
    with pytest.raises(ConfigError, match="http://b claims 0.85 of each GPU, the config 0.35"):
        gpu_memory.check_external_sidecars(c, {"http://b": {"gpu_memory": {"vllm_gpu_memory_utilization": 0.85}}})
    c.generator.backend = "jax"  # external JAX sidecars report their XLA fraction
    with pytest.raises(ConfigError, match="claims 0.5 of each GPU"):
        gpu_memory.check_external_sidecars(c, {"http://b": {"gpu_memory": {"xla_mem_fraction": 0.5}}})
    assert [who for who, _ in gpu_memory.claims(c)][1] == "JAX sidecar (generator.gpu_memory_utilization)"
    c.generator.colocate_with_trainer = False  # on their own nodes: their share is theirs
    gpu_memory.check_external_sidecars(c, {"http://b": {"gpu_memory": {"vllm_gpu_memory_utilization": 0.85}}})
    assert len(gpu_memory.claims(c)) == 1


def test_plan_line_puts_the_share_next_to_the_estimate():
    c = with_keys(**{"trainer.gpu_memory_fraction": 0.5})
    line = gpu_memory.plan_line(c, int(63.62 * 2**30), 140.0)
    assert "0.50 x 140 GiB = 70.0 GiB" in line and "estimate of 63.62 GiB: fits" in line
    line = gpu_memory.plan_line(c, int(80 * 2**30), 140.0)
    assert "does NOT fit" in line and ">= 0.57" in line
