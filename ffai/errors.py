"""One exception family. Library code raises these with context; only the command line
(``ffai.cli``) turns them into a one-line ``ffai: error: ...`` message and an exit code."""

from __future__ import annotations


class FfaiError(Exception):
    """Base of every error ffai reports to a user. ``exit_code`` is the process exit status."""

    exit_code = 1


class UsageError(FfaiError):
    """Flags or arguments that do not make sense together (exit 2, like a usage error)."""

    exit_code = 2


class MediaError(FfaiError):
    """An input that cannot be probed or decoded."""


class OutputError(FfaiError):
    """An output that cannot be written, or that exists and may not be overwritten."""


class ModelError(FfaiError):
    """A checkpoint that cannot be found, read or understood."""


class EngineError(FfaiError):
    """An engine failed while running a request."""
