"""Silences the library messages every jaxrl command would print and that say nothing about the run.

Each filter drops one known message, matched exactly by its logger and text; every other record
of the same logger, and every other warning, still shows. Installed when `jaxrl` is imported
(before transformers is), so `import jaxrl` in a notebook is quiet too.

Silenced:
* transformers: "PyTorch was not found. Models won't be available and only tokenizers,
  configuration and file/data utilities can be used." (and its 4.x wording, "None of PyTorch,
  TensorFlow >= 2.0, or Flax have been found. ..."): printed on import by every process of an
  install without torch (the default: jaxrl uses only transformers' tokenizers and configs; torch
  comes with the `dev` extra, for the tests).
"""
from __future__ import annotations

import logging

# (logger name, exact start of the message) of each silenced record.
SILENCED: tuple[tuple[str, str], ...] = (
    ("transformers", "PyTorch was not found. Models won't be available and only tokenizers, configuration"),
    ("transformers", "None of PyTorch, TensorFlow >= 2.0, or Flax have been found. Models won't be available"),
)


class _DropKnownMessages(logging.Filter):
    """Drops records whose message starts with one of `prefixes` (exact text); passes the rest."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge: let it through
            return True
        return not msg.startswith(self.prefixes)


def install() -> None:
    """Adds the filters of `SILENCED` to their loggers (idempotent). A logger filter sees the
    records created on that logger, which is where these messages are logged."""
    by_logger: dict[str, tuple[str, ...]] = {}
    for name, prefix in SILENCED:
        by_logger[name] = by_logger.get(name, ()) + (prefix,)
    for name, prefixes in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownMessages) for f in logger.filters):
            logger.addFilter(_DropKnownMessages(prefixes))
