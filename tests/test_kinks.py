"""Gradients at kinks (issue 25 §1): every abs / max / min / clip / where / sign in jaxrl.rl that is
evaluated exactly at its kink (or a tie) in the common case — the first update of a step (π_θ =
π_old), the first step (π_θ = π_ref), V = V_old, equal rewards, ties in a selection — has the
gradient chosen in docs/recipes.md "Gradients at kinks". References are the same formulas written in
float64 torch and differentiated by torch autograd (torch's abs, clamp and maximum at the kink), or
by hand; never the code under test."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxrl import rl


def _grad(batch, config, **extra):
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    w = rl.compute_loss_weights(b["loss_mask"], config, old_logprobs=b["old_logprobs"], advantages=b["advantages"],
                                rng=jax.random.key(0))

    def f(lp):
        return rl.micro_batch_loss(lp, b["old_logprobs"], b["advantages"], b["loss_mask"], w, config,
                                   ref_logprobs=b.get("ref_logprobs"), **extra)[0]

    return np.asarray(jax.grad(f)(b["logprobs"]), np.float64)


def _torch_grad(fn, lp):
    x = torch.tensor(np.asarray(lp, np.float64), requires_grad=True)
    fn(x).backward()
    return x.grad.numpy()


def test_kl_cov_first_update_gradient_is_reinforce():
    """The issue's input: log π = log π_old = [−1, −2, −4], A = [1, −1, 0.5], kl_cov_frac 0.34 (one
    token: the largest covariance, token 0), ppo_kl_coef 1, token_mean. The penalty |Δ| is at its
    minimum, so ∂loss/∂log π = −A/3 = [−1/3, 1/3, −1/6] (main gave [0, 1/3, −1/6])."""
    old = np.array([[-1.0, -2.0, -4.0]], np.float32)
    a = np.array([[1.0, -1.0, 0.5]], np.float32)
    m = np.ones((1, 3), np.float32)
    config = rl.LossConfig(policy_loss_type="kl_cov", kl_cov_frac=0.34, ppo_kl_coef=1.0)
    got = _grad(dict(logprobs=old, old_logprobs=old, advantages=a, loss_mask=m), config)
    s = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)  # the top-covariance token, by hand
    old_t, a_t = torch.tensor(old, dtype=torch.float64), torch.tensor(a, dtype=torch.float64)
    ref = _torch_grad(lambda lp: (-a_t * torch.exp(lp - old_t) + s * 1.0 * (lp - old_t).abs()).sum() / 3, old)
    np.testing.assert_allclose(ref, [[-1 / 3, 1 / 3, -1 / 6]], rtol=1e-12)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    # away from the kink the penalty's gradient is coef·sign(Δ), both signs
    lp = old + np.array([[0.1, -0.1, 0.2]], np.float32)
    got = _grad(dict(logprobs=lp, old_logprobs=old, advantages=a, loss_mask=m), config)
    ref = _torch_grad(lambda x: (-a_t * torch.exp(x - old_t) + s * (x - old_t).abs()).sum() / 3, lp)
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_abs_kl_estimator_gradient_is_zero_where_policy_equals_reference():
    """The `abs` KL loss at step 0 (π_θ = π_ref on every token): torch's |Δ| has gradient 0 there;
    main gave +kl_loss_coef·w on every token. Other tokens: kl_loss_coef·sign(Δ)·w."""
    lp = np.array([[-1.0, -2.0, -0.5, -3.0]], np.float32)
    ref = np.array([[-1.0, -2.5, -0.5, -2.0]], np.float32)  # Δ = [0, 0.5, 0, −1]
    m = np.ones((1, 4), np.float32)
    batch = dict(logprobs=lp, old_logprobs=lp, advantages=np.zeros_like(lp), loss_mask=m, ref_logprobs=ref)
    got = _grad(batch, rl.LossConfig(kl_loss_coef=0.5, kl_estimator_type="abs"))
    ref_t = torch.tensor(ref, dtype=torch.float64)
    want = _torch_grad(lambda x: 0.5 * (x - ref_t).abs().sum() / 4, lp)  # sequence mean of 1 row, 4 tokens
    np.testing.assert_allclose(want, [[0.0, 0.125, 0.0, -0.125]], atol=1e-15)
    np.testing.assert_allclose(got, want, atol=1e-8)
    # the helper on its own: value |x|, derivative sign(x)
    x = jnp.array([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(np.asarray(rl.losses.abs_with_zero_subgradient(x)), [2.0, 0.0, 3.0])
    np.testing.assert_array_equal(np.asarray(jax.vmap(jax.grad(rl.losses.abs_with_zero_subgradient))(x)),
                                  [-1.0, 0.0, 1.0])


@pytest.mark.parametrize("eps_low,eps_high", [(0.2, 0.2), (0.0, 0.28), (0.2, 0.0)])
@pytest.mark.parametrize("name", ["regular", "dual_clip", "clip_cov"])
def test_ppo_clip_at_ratio_one_gives_the_reinforce_gradient(name, eps_low, eps_high):
    """r = 1 (first update) is a tie of the two PPO branches, and with ε = 0 also the clip's
    boundary. The unclipped branch carries the gradient: −A·w, as torch's max/clamp give (torch splits
    a max tie 1/2 : 1/2 and clamp passes the gradient at its bounds, which sums to the same)."""
    old = np.array([[-1.0, -2.0, -0.5, -3.0]], np.float32)
    a = np.array([[1.0, -1.0, 0.5, -2.0]], np.float32)
    m = np.ones((1, 4), np.float32)
    config = rl.LossConfig(policy_loss_type=name, eps_clip_low=eps_low, eps_clip_high=eps_high,
                           clip_cov_ratio=1e-9, clip_cov_lb=100.0, clip_cov_ub=101.0)  # clip_cov: nothing cut
    got = _grad(dict(logprobs=old, old_logprobs=old, advantages=a, loss_mask=m), config)
    old_t, a_t = torch.tensor(old, dtype=torch.float64), torch.tensor(a, dtype=torch.float64)

    def ppo(x):
        r = torch.exp(x - old_t)
        return torch.maximum(-a_t * r, -a_t * torch.clamp(r, 1 - eps_low, 1 + eps_high)).sum() / 4

    want = _torch_grad(ppo, old)
    np.testing.assert_allclose(want, -a / 4, rtol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_value_loss_at_v_equal_v_old_regresses_fully():
    """V = V_old (every first update): the clipped and unclipped branches tie; the gradient is the
    unclipped one, (V − R)·w, as torch.max + clamp (SkyRL's critic loss) gives."""
    v = np.array([[0.5, -1.0, 2.0]], np.float32)
    ret = np.array([[1.0, -1.0, 0.0]], np.float32)
    m = np.ones((1, 3), np.float32)
    w = rl.compute_loss_weights(m, rl.LossConfig())
    got = np.asarray(jax.grad(lambda x: rl.value_loss(x, jnp.asarray(v), ret, m, w, 0.2)[0])(jnp.asarray(v)))
    v_old, r_t = torch.tensor(v, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)

    def critic(x):
        clipped = v_old + torch.clamp(x - v_old, -0.2, 0.2)
        return 0.5 * torch.maximum((clipped - r_t) ** 2, (x - r_t) ** 2).sum() / 3

    want = _torch_grad(critic, v)
    np.testing.assert_allclose(want, (v.astype(np.float64) - ret) / 3, rtol=1e-7)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_k3_and_k2_at_policy_equal_reference_have_zero_gradient():
    """k3 = e^x − x − 1 and k2 = ½Δ² are smooth at Δ = 0 with derivative 0 (their clamps are inactive)."""
    lp = np.array([[-1.0, -2.0]], np.float32)
    m = np.ones((1, 2), np.float32)
    batch = dict(logprobs=lp, old_logprobs=lp, advantages=np.zeros_like(lp), loss_mask=m, ref_logprobs=lp)
    for kind in ("k2", "k3"):
        assert not np.any(_grad(batch, rl.LossConfig(kl_loss_coef=1.0, kl_estimator_type=kind))), kind


def test_kl_cov_tied_covariances_select_by_position_whatever_the_split():
    """Equal rewards make every advantage 0, so every covariance ties at 0: kl_cov then selects the
    first ⌊frac·n⌋ loss tokens in row-major order (the same on any micro-batching or sharding,
    as the selection is made once per mini-batch), and at the first update their penalty
    gradient is 0 (|Δ| at its kink), so the whole gradient is 0 (A = 0)."""
    old = np.array([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]], np.float32)
    m = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
    a = np.zeros_like(old)
    config = rl.LossConfig(policy_loss_type="kl_cov", kl_cov_frac=0.4)  # ⌊0.4·5⌋ = 2 tokens
    w = rl.compute_loss_weights(m, config, old_logprobs=old, advantages=a)
    np.testing.assert_array_equal(np.asarray(w.selected), [[1, 1, 0], [0, 0, 0]])
    assert not np.any(_grad(dict(logprobs=old, old_logprobs=old, advantages=a, loss_mask=m), config))
