"""Config helpers shared by the config-validation tests (test_config, test_algorithm_config,
test_async, test_sidecar_config, test_terminal_trainer)."""
from __future__ import annotations

from jaxrl import config as config_lib


def set_key(c, key: str, value):
    """`c` with the dotted `key` set to `value`, as `--config.key=value` would (returns `c`)."""
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    return c


def with_keys(c=None, **dotted):
    """`c` (default: `base_config()` at the cpu scale) with every dotted key of `dotted` set; keys
    with dots are passed as `**{"trainer.num_steps": 3}`."""
    if c is None:
        c = config_lib.base_config()
        config_lib.apply_scale(c, "cpu")
    for key, value in dotted.items():
        set_key(c, key, value)
    return c
