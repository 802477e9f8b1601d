"""What the trainer derives from a resolved run config: the objective's dataclasses
(`loss_config`, `advantage_config`, built from the `trainer.algorithm` Fields that declare them:
no mapping table), the questions asked of them (`needs_critic`, `needs_reference`), the trajectory
budget, the logprob warning bound, and the `rl_config.json` dump (`to_json_dict`,
`logprob_definitions`, `write_json_atomic`)."""
from __future__ import annotations

import json
from typing import Any

import ml_collections

from jaxrl.config.algorithm import ALGORITHM
from jaxrl.config.schema import get_value
from jaxrl.errors import ConfigError
from jaxrl.fileio import atomic_write_json


def _objective(cls, owner: str, c: ml_collections.ConfigDict, **override):
    """`cls(**kwargs)` with every `trainer.algorithm` Field of `owner` converted from the config
    (`Field.to_object`: an off value becomes None); a ValueError of the dataclass (its own
    cross-field checks) becomes a ConfigError naming the key whose attribute it names first."""
    fields = [f for f in ALGORITHM if f.owner == owner]
    kwargs = {f.attr: f.to_object(get_value(c, f.key)) for f in fields}
    kwargs.update(override)
    try:
        return cls(**kwargs)
    except ValueError as e:  # the dataclass names its field first; report the config key
        text = str(e)
        hits = sorted((text.find(f.attr), f.key) for f in fields if f.attr in text)
        key = hits[0][1] if hits else "trainer.algorithm"
        raise ConfigError(key, text.rstrip("."), "see docs/recipes.md, 'trainer.algorithm keys'") from None


def loss_config(c: ml_collections.ConfigDict):
    """The `jaxrl.rl.LossConfig` of a run config: its fields are the `trainer.algorithm` Fields with
    owner "loss" (jaxrl/config/algorithm.py), each read from its key.

    With `use_kl_in_reward` the KL enters the rewards, not the loss (kl_loss_coef is then the
    controller's initial beta), so the loss's KL term is off.
    Raises: ConfigError naming the key when LossConfig rejects a value.
    """
    from jaxrl.rl.loss_config import LossConfig

    override = {"use_kl_loss": False} if c.trainer.algorithm.use_kl_in_reward else {}
    return _objective(LossConfig, "loss", c, **override)


def advantage_config(c: ml_collections.ConfigDict):
    """The `jaxrl.rl.AdvantageConfig` of a run config (the Fields with owner "advantage").
    Raises: ConfigError naming the key when AdvantageConfig rejects a value."""
    from jaxrl.rl.advantages import AdvantageConfig

    return _objective(AdvantageConfig, "advantage", c)


def needs_critic(c: ml_collections.ConfigDict) -> bool:
    """True when the run's advantage estimator needs a value model (the trainer then creates a critic)."""
    from jaxrl.rl import registry

    return registry.estimator_needs_values(c.trainer.algorithm.advantage_estimator)


def needs_reference(c: ml_collections.ConfigDict) -> bool:
    """True when the run needs reference-policy logprobs: a KL loss term or a KL-in-reward penalty."""
    from jaxrl.rl.loss_config import needs_reference_model

    return bool(c.trainer.algorithm.use_kl_in_reward) or needs_reference_model(loss_config(c))


def logprob_diff_warn_threshold(c: ml_collections.ConfigDict) -> float:
    """The bound `trainer.logprob_diff_warn_threshold` stands for (-1: by model.compute_dtype)."""
    t = float(c.trainer.logprob_diff_warn_threshold)
    if t != -1:
        return t
    return 1e-3 if c.model.compute_dtype == "float32" else 1.0


def rollout_max_seq_len(c: ml_collections.ConfigDict) -> int:
    """Token budget of one trajectory: max_prompt_length + max_turns x max_generate_length, capped
    by `trainer.algorithm.max_seq_len` when that is set."""
    g = c.generator
    n = c.data.max_prompt_length + g.max_turns * g.sampling_params.max_generate_length
    return min(n, int(c.trainer.algorithm.max_seq_len)) if c.trainer.algorithm.max_seq_len else n


def to_json_dict(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """A JSON-serializable dict of the resolved config (tuples become lists)."""
    return json.loads(c.to_json_best_effort())


def logprob_definitions(c: ml_collections.ConfigDict) -> dict[str, str]:
    """In words, which log-probabilities a run trains with (rl_config.json `_derived.logprobs`):
    `trainer` (π_θ and π_old: the trainer's forward), `engine` (μ: what the rollout engine returns
    for each sampled token, `generator.logprobs_mode`), `sampling` (what drew the tokens) and
    `ratio` (what the PPO ratio and TIS weight compare)."""
    sp, a, mode = c.generator.sampling_params, c.trainer.algorithm, c.generator.logprobs_mode
    filt = f", top-p {sp.top_p:g}, top-k {sp.top_k}" if (sp.top_p < 1 or sp.top_k > 0) else ""
    engine = {"full": f"log_softmax(logits / {sp.temperature:g}) over the full vocabulary",
              "sampled": f"log_softmax over the tokens top-p/top-k keep of logits / {sp.temperature:g} (the "
                         "distribution sampled)",
              "raw": "log_softmax(logits) at temperature 1 over the full vocabulary (vLLM's raw_logprobs, as the "
                     "seed runs' vLLM returned)"}.get(mode, mode)
    return {"trainer": f"log_softmax(logits / {a.temperature:g}) over the full vocabulary",
            "engine": engine, "sampling": f"temperature {sp.temperature:g}{filt}",
            "ratio": "PPO ratio pi_theta / pi_old (both the trainer's); TIS / off-policy weight pi_old / mu with "
                     "mu the engine's logprob above"}


def write_json_atomic(path: str, obj: Any) -> None:
    """Writes JSON to `path` atomically (temp file in the same directory, then rename)."""
    atomic_write_json(path, obj)
