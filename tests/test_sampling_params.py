"""SamplingParams validation and the JAX engine's token selection at extreme sampling settings
(issue 9 §3: sampling parameters at their extremes never give NaN tokens or logprobs)."""
import jax
import numpy as np
import pytest

from jaxrl.rollout.types import MIN_TEMPERATURE, SamplingParams


@pytest.mark.parametrize("field,value,match", [
    ("temperature", 0.0, "temperature must be a finite"),
    ("temperature", 1e-3, "greedy=True"),
    ("temperature", float("nan"), "temperature"),
    ("temperature", float("inf"), "temperature"),
    ("temperature", 1e39, "temperature"),  # inf once cast to float32
    ("temperature", "1.0", "temperature"),
    ("top_p", 0.0, "top_p"),
    ("top_p", float("nan"), "top_p"),
    ("top_p", 1.5, "top_p"),
    ("top_k", -2, "top_k must be an integer >= -1"),
    ("top_k", 2.5, "top_k"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", 3.0, "max_tokens"),
    ("max_tokens", True, "max_tokens"),
    ("n", 0, "n must be"),
    ("stop_token_ids", (1, -5), "stop_token_ids"),
    ("stop_token_ids", ("a",), "stop_token_ids"),
    ("seed", 1.5, "seed"),
    ("greedy", "yes", "greedy"),
])
def test_bad_sampling_params_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}") as e:
        SamplingParams(**{field: value})
    assert e.match(match)


def test_extreme_but_valid_params_are_accepted():
    p = SamplingParams(temperature=MIN_TEMPERATURE, top_p=1e-30, top_k=-1, stop_token_ids=[np.int64(3)],
                       seed=-7, max_tokens=np.int32(4))
    assert p.stop_token_ids == (3,) and type(p.stop_token_ids[0]) is int
    SamplingParams(temperature=1e30, top_k=1, greedy=True)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# One row per extreme setting: (temperature, top_p, top_k, greedy, the token must be the argmax).
EXTREMES = [
    (MIN_TEMPERATURE, 1.0, 0, False, False),
    (MIN_TEMPERATURE, 1.0, 0, True, True),
    (1e30, 1.0, 0, False, False),
    (3e38, 1.0, 0, False, False),  # the largest float32 temperature: uniform, -log V
    (1.0, 1e-30, 0, False, True),  # 0 in float32: the most likely token is still kept
    (5.0, 1e-6, 0, False, True),
    (50.0, 1.0, 1, False, True),
    (MIN_TEMPERATURE, 1e-30, 1, True, True),
]


def test_token_selection_at_extreme_settings_is_finite_and_matches_float64():
    """The JAX engine's token selection (`sampler.select_tokens`) on logits of bf16-model size (tens)
    and adversarial ones (1e4, exact ties): tokens in range, logprobs finite and equal to
    log_softmax(logits / T)[token] computed in float64, argmax where the setting implies it."""
    from jaxrl.rollout.sampler import select_tokens

    rng = np.random.default_rng(0)
    V = 64
    base = [30.0 * rng.standard_normal(V), 1e4 * rng.standard_normal(V), np.r_[np.full(4, 20.0), np.zeros(V - 4)]]
    logits = np.stack([base[i % 3] for i in range(len(EXTREMES))]).astype(np.float32)
    T, top_p, top_k, greedy, argmax = (np.array(col) for col in zip(*EXTREMES))
    keys = jax.random.split(jax.random.PRNGKey(3), len(EXTREMES))
    tokens, lps = jax.jit(select_tokens)(logits, keys, T.astype(np.float32), top_p.astype(np.float32),
                                         top_k.astype(np.int32), greedy)
    tokens, lps = np.asarray(tokens), np.asarray(lps, np.float64)
    assert ((0 <= tokens) & (tokens < V)).all() and np.isfinite(lps).all()
    rows = np.arange(len(EXTREMES))
    ref = _log_softmax(logits.astype(np.float64) / T.astype(np.float32).astype(np.float64)[:, None])[rows, tokens]
    np.testing.assert_allclose(lps, ref, rtol=1e-5, atol=1e-3)
    top = logits.max(-1)
    assert (logits[rows, tokens][argmax] == top[argmax]).all()  # a (tied) most likely token
