"""jaxrl's side of the differential tier: the same cases through jaxrl.rl, outputs keyed like skyrl_side.py's.

Runs eagerly (no jit: the cases' configs differ, and eager dispatch compiles once per shape and primitive).
Gradients are jax.grad of the scalar loss (of Σ kl·cotangent for the KL estimators), against torch autograd.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.rl import (AdvantageConfig, LossConfig, compute_advantages_and_returns, compute_loss_weights,
                      kl_penalized_rewards, kl_penalty, micro_batch_loss, off_policy_correction, update_kl_coef,
                      value_loss)
from jaxrl.rl import registry

SUM = "skyrl_diff_sum"  # the loss functions' plain masked sum: weights = the loss mask (cases.loss_opts "sum")
if SUM not in registry.LOSS_REDUCTIONS:
    registry.register_loss_reduction(SUM)(lambda loss_mask, sequence_mask, config: loss_mask)

F32 = jnp.float32


def f32(x):
    return jnp.asarray(np.asarray(x, np.float64), F32)


def run(case):
    return globals()["op_" + case["op"]](case)


def op_adv(case):
    x, o = case["x"], case["opts"]
    cfg = AdvantageConfig(advantage_estimator=o.get("jaxrl_estimator", o["estimator"]),
                          grpo_norm_by_std=o.get("grpo_norm_by_std", True),
                          group_advantage_min_size=o.get("group_advantage_min_size", 2),
                          gamma=o.get("gamma", 1.0), lambd=o.get("lambd", 1.0))
    adv, ret = compute_advantages_and_returns(
        f32(x["token_rewards"]), f32(x["response_mask"]) > 0, jnp.asarray(x["index"], jnp.int32),
        loss_mask=None if "loss_mask" not in x else f32(x["loss_mask"]) > 0,
        values=None if "values" not in x else f32(x["values"]), config=cfg)
    return {"advantages": np.asarray(adv), "returns": np.asarray(ret)}


def op_reduce(case):
    x, o = case["x"], case["opts"]
    cfg = LossConfig(loss_reduction=o["loss_reduction"], max_seq_len=o.get("max_seq_len"))
    w = compute_loss_weights(f32(x["loss_mask"]), cfg)
    return {"scaled_advantages": np.asarray(w.policy * f32(x["advantages"]))}


def loss_config(case):
    cfg = dict(case["opts"]["jaxrl_cfg"])
    if cfg["loss_reduction"] == "sum":
        cfg["loss_reduction"] = SUM
    return LossConfig(**cfg)


def op_loss(case):
    x, o = case["x"], case["opts"]
    cfg = loss_config(case)
    mask = f32(x["loss_mask"])
    old, adv = f32(x["old_logprobs"]), f32(x["advantages"])
    select_from = f32(x["logprobs"]) if o.get("selection_from") == "logprobs" else old
    weights = compute_loss_weights(mask, cfg, old_logprobs=select_from, advantages=adv,
                                   rng=jax.random.PRNGKey(0))
    mu = None if "rollout_logprobs" not in x else f32(x["rollout_logprobs"])

    def loss_fn(lp):
        return micro_batch_loss(lp, old, adv, mask, weights, cfg, rollout_logprobs=mu)

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(f32(x["logprobs"]))
    return {"loss": np.asarray(loss), "grad": np.asarray(grad),
            **{"metric/" + k: float(v) for k, v in metrics.items()}}


def op_opc(case):
    x, o = case["x"], case["opts"]
    cfg = LossConfig(**o["jaxrl_cfg"])
    mask = f32(x["loss_mask"])
    weights = compute_loss_weights(mask, cfg)
    factor, kept, metrics = off_policy_correction(f32(x["old_logprobs"]), f32(x["rollout_logprobs"]), mask, weights,
                                                  cfg)
    out = {"kept_mask": np.asarray(kept, np.float32), **{"metric/" + k: float(v) for k, v in metrics.items()}}
    if cfg.tis_ratio_type is not None:
        out["factor"] = np.asarray(factor)
    return out


def op_kl(case):
    x, o = case["x"], case["opts"]
    ref, mask, cot = f32(x["ref_logprobs"]), f32(x["loss_mask"]), f32(x["cotangent"])
    kl, vjp = jax.vjp(lambda lp: kl_penalty(lp, ref, mask, o["estimator"]), f32(x["logprobs"]))
    return {"kl": np.asarray(kl), "grad": np.asarray(vjp(cot)[0])}


def op_kl_reward(case):
    x, o = case["x"], case["opts"]
    rewards, metrics = kl_penalized_rewards(f32(x["token_rewards"]), f32(x["old_logprobs"]), f32(x["ref_logprobs"]),
                                            f32(x["loss_mask"]), o["kl_coef"], o["estimator"])
    out = {"rewards": np.asarray(rewards), "avg_kl": float(metrics["avg_kl"]),
           "avg_kl_max": float(metrics["avg_kl_max"])}
    if o.get("use_controller"):
        ctrl = o["kl_ctrl"]
        out["next_kl_coef"] = update_kl_coef(o["kl_coef"], out["avg_kl"], x["loss_mask"].shape[0], ctrl["type"],
                                             ctrl.get("kl_target", 0.1), ctrl.get("horizon", 10000))
    return out


def op_kl_ctrl(case):
    o = case["opts"]
    value, values = o["init"], []
    for current, n_steps in o["updates"]:
        value = update_kl_coef(value, current, n_steps, o["type"], o["target"], o["horizon"])
        values.append(value)
    return {"values": values}


def op_critic(case):
    x, o = case["x"], case["opts"]
    mask = f32(x["loss_mask"])
    weights = compute_loss_weights(mask, LossConfig())

    def fn(v):
        return value_loss(v, f32(x["old_values"]), f32(x["returns"]), mask, weights, o["value_clip"])

    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(f32(x["values"]))
    out = {"loss": np.asarray(loss), "grad": np.asarray(grad)}
    if "values_clipfrac" in metrics:
        out["values_clipfrac"] = float(metrics["values_clipfrac"])
    return out
