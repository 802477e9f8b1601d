"""Metrics never count what a mask removed (issue 25 §2), and the sequence-level off-policy
quantities sum the unclamped log-ratios, clamping the sum as SkyRL does (§3). References are
float64 numpy written here from the definitions (docs/recipes.md "Metrics")."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import rl


def run(lp, old, mu, a, m, **options):
    config = rl.LossConfig(**{"eps_clip_high": 0.2, **options})  # the eps = 0.2 of the docstrings below
    args = [jnp.asarray(np.asarray(x, np.float32)) for x in (lp, old, a, m)]
    w = rl.compute_loss_weights(args[3], config)
    return rl.micro_batch_loss(*args, w, config, rollout_logprobs=jnp.asarray(np.asarray(mu, np.float32)))


def test_tis_clip_ratio_skips_tokens_the_token_mask_dropped():
    """The issue's input: old [−1, −1], rollout [−2, −1] (ρ = [e, 1]), token TIS cap 2, token mask
    [0.5, 2]. Token 0 is capped but also dropped by the mask, so no token in the loss is capped: 0
    (main: 0.5). The mask's own metric still says it dropped half the tokens."""
    old, mu, m = [[-1.0, -1.0]], [[-2.0, -1.0]], [[1.0, 1.0]]
    _, metrics = run(old, old, mu, [[1.0, 1.0]], m, tis_ratio_type="token", token_tis_ratio_clip_high=2.0,
                     token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=2.0)
    assert float(metrics["tis_token_clip_high_ratio"]) == 0.0
    assert float(metrics["token_mask_ratio"]) == 0.5
    # without the mask the capped token is in the loss and counts
    _, metrics = run(old, old, mu, [[1.0, 1.0]], m, tis_ratio_type="token", token_tis_ratio_clip_high=2.0)
    assert float(metrics["tis_token_clip_high_ratio"]) == 0.5


def _two_rows():
    """Row 0: ρ = [e^3, 1, 1] (an outlier above 10); row 1: ρ = [e, 1, e^-3]; 6 loss tokens."""
    old = np.array([[-1.0, -1.0, -1.0], [-1.0, -1.0, -4.0]])
    mu = old - np.array([[3.0, 0.0, 0.0], [1.0, 0.0, -3.0]])
    return old, mu, np.ones((2, 3))


def test_token_mask_ratio_skips_rows_the_outlier_mask_dropped():
    """Outlier high 10 drops row 0; the token mask [0.1, 2] would drop row 0's token 0 and row 1's
    tokens 0 and 2. Only row 1's two count (row 0 is gone already): 2/6 (main: 3/6)."""
    old, mu, m = _two_rows()
    rho = np.exp(old - mu)
    assert rho[0, 0] > 10 and rho[1, 0] > 2 and rho[1, 2] < 0.1
    _, metrics = run(old, old, mu, np.ones_like(old), m, outlier_token_is_threshold_high=10.0,
                     token_mask_is_threshold_low=0.1, token_mask_is_threshold_high=2.0)
    np.testing.assert_allclose(float(metrics["outlier_seq_masked_ratio"]), 0.5, rtol=1e-7)
    np.testing.assert_allclose(float(metrics["token_mask_ratio"]), 2 / 6, rtol=1e-6)


def test_sequence_tis_and_sequence_mask_count_only_rows_still_in_the_loss():
    """Row 0 is dropped by the outlier mask; its (then empty) sequence ratio is 1, which is outside
    the geometric bounds [1.5, 3] but must not be dropped or counted again. Row 1's geometric mean
    is exp((1 + 0 − 3)/3) < 1.5: dropped by the sequence mask, so its sequence TIS weight (e^−2,
    capped at 0.01) is not in the loss either: no row in the loss is capped."""
    old, mu, m = _two_rows()
    _, metrics = run(old, old, mu, np.ones_like(old), m, outlier_token_is_threshold_high=10.0,
                     sequence_mask_metric="geometric", geo_mask_low=1.5, geo_mask_high=3.0,
                     tis_ratio_type="sequence", sequence_tis_ratio_clip_high=0.01)
    assert float(metrics["geo_sequence_mask_masked_ratio"]) == 0.5  # row 1 only (main: 1.0)
    assert float(metrics["geo_sequence_mask_under_low_ratio"]) == 0.5
    assert float(metrics["tis_seq_clip_high_ratio"]) == 0.0  # no row left in the loss (main: 0.5)


def test_policy_loss_metrics_count_only_tokens_in_the_loss():
    """A token the token mask dropped is not "clipped in the loss": clip_ratio, ratio_max skip it;
    ratio_mean counts it at π_θ = π_old (ratio 1). Tokens: r = [1.5, 1.1, 0.9], A = 1, ε = 0.2:
    only token 0 is clipped; ρ = [e, 1, 1] with mask [0.5, 2] drops token 0."""
    old = np.array([[-1.0, -1.0, -1.0]])
    lp = old + np.log([[1.5, 1.1, 0.9]])
    mu = old - np.array([[1.0, 0.0, 0.0]])
    m = np.ones((1, 3))
    opts = dict(token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=2.0)
    loss, metrics = run(lp, old, mu, np.ones_like(old), m, **opts)
    assert float(metrics["clip_ratio"]) == 0.0  # main: 1/3
    assert float(metrics["clip_ratio_high"]) == 0.0
    np.testing.assert_allclose(float(metrics["ratio_max"]), 1.1, rtol=1e-6)  # main: 1.5
    np.testing.assert_allclose(float(metrics["ratio_min"]), 0.9, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_mean"]), (1.0 + 1.1 + 0.9) / 3, rtol=1e-6)  # main: 2.0/3
    np.testing.assert_allclose(float(loss), -(1.1 + 0.9) / 3, rtol=1e-6)
    # dual_clip, cispo, kl_cov: their fractions skip the dropped token too
    _, metrics = run(lp, old, mu, -np.ones_like(old), m, policy_loss_type="dual_clip", clip_ratio_c=1.05, **opts)
    assert float(metrics["dual_clip_ratio"]) == pytest.approx(1 / 3)  # token 1 (r = 1.1 > c); main: 2/3
    _, metrics = run(lp, old, mu, np.ones_like(old), m, policy_loss_type="cispo", cispo_eps_clip_low=0.0,
                     cispo_eps_clip_high=0.2, **opts)
    assert float(metrics["clip_ratio"]) == pytest.approx(1 / 3)  # token 2 (r = 0.9 < 1); main: 2/3
    np.testing.assert_allclose(float(metrics["cispo/ratio_mean"]), (1.0 + 1.1 + 0.9) / 3, rtol=1e-6)


def test_invalid_rows_are_skipped_by_the_loss_metrics_and_means_stay_means():
    """A row with a NaN rollout logprob is dropped from the loss: its clipped token is not counted
    and ratio_mean counts its tokens at ratio 1 (main counted them as 0: a mean below every ratio)."""
    old = np.array([[-1.0, -1.0], [-1.0, -1.0]])
    lp = old + np.log([[1.1, 1.1], [1.5, 1.5]])
    mu = np.array([[-1.0, -1.0], [np.nan, -1.0]])
    _, metrics = run(lp, old, mu, np.ones_like(old), np.ones((2, 2)))
    assert float(metrics["clip_ratio"]) == 0.0
    np.testing.assert_allclose(float(metrics["ratio_mean"]), (1.1 + 1.1 + 1 + 1) / 4, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_max"]), 1.1, rtol=1e-6)


def test_sequence_ratios_clamp_the_sum_not_the_tokens():
    """SkyRL: exp(clamp(Σ log ρ, ±20)). Tokens log ρ = [30, −25] sum to 5: the sequence TIS weight is
    e^5 (main clamped each token to ±20 first: e^0 = 1), the geometric mean e^2.5, the product e^5."""
    old = np.array([[-1.0, -26.0]])
    mu = np.array([[-31.0, -1.0]])
    m = np.ones((1, 2))
    a = np.ones_like(old)
    loss, metrics = run(old, old, mu, a, m, tis_ratio_type="sequence", sequence_tis_ratio_clip_high=1e6)
    np.testing.assert_allclose(float(loss), -np.exp(5.0), rtol=1e-5)  # token mean of −A·1·e^5
    # geometric mean e^2.5 = 12.2: kept by [10, 13], dropped by [0.5, 2] (main: 1, the other way round)
    _, metrics = run(old, old, mu, a, m, sequence_mask_metric="geometric", geo_mask_low=10.0, geo_mask_high=13.0)
    assert float(metrics["geo_sequence_mask_masked_ratio"]) == 0.0
    _, metrics = run(old, old, mu, a, m, sequence_mask_metric="product", product_mask_low=100.0,
                     product_mask_high=200.0)  # e^5 = 148.4
    assert float(metrics["product_sequence_mask_masked_ratio"]) == 0.0
