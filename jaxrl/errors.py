"""Exceptions shared across layers; this module imports nothing of jaxrl.

`ConfigError` is raised by `jaxrl.config.validate` and by the modules whose checks it runs
(`jaxrl.gpu_memory`): they import it from here, so `jaxrl.config` can call them without an import
cycle. Its public name stays `jaxrl.config.ConfigError` (re-exported there).
"""
from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key and how to fix it.

    `ConfigError(key, problem, fix)`; a single argument is taken as the whole message (libraries
    such as ml_collections re-raise an exception as `type(e)(message)`).
    """

    def __init__(self, key: str, problem: str | None = None, fix: str | None = None):
        super().__init__(key if problem is None else f"config key `{key}`: {problem}. Fix: {fix}")
        self.key = key
