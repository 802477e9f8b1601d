"""Errors of the Harbor task layer (one-line messages that name the task, field or file and the fix)."""


class HarborTaskError(ValueError):
    """A task directory, `task.toml`, task archive or environment is invalid; the message names the task
    path and the missing or bad piece."""


class UnsupportedEnvironmentError(HarborTaskError):
    """A task environment (Dockerfile) the local sandbox cannot provide; the message names the
    Dockerfile line and instruction."""


class SandboxError(RuntimeError):
    """The sandbox could not start or run a command (the message gives the reason)."""


class SandboxUnavailableError(SandboxError):
    """The sandbox cannot run on this host at all (bubblewrap missing, user namespaces disabled, ...)."""


class AgentTimeoutError(TimeoutError):
    """The trial's agent time budget is spent: no more agent commands run (the verifier still does)."""
