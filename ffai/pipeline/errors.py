"""The pipeline's errors, all :class:`ffai.errors.FfaiError` children."""

from __future__ import annotations

from typing import Any

from ffai.errors import FfaiError


class PipelineError(FfaiError):
    """The pipeline cannot do what was asked (closed, broken, misused)."""


class ConfigError(PipelineError):
    """A pipeline configuration that cannot work; raised before any worker starts."""


class PipelineStartError(PipelineError):
    """A worker did not report ready; the message carries its traceback text."""


class WorkerDied(PipelineError):
    """A worker process exited while the pipeline was running."""


class RequestAborted(PipelineError):
    """The request was aborted before it finished."""


class StageError(PipelineError):
    """A stage failed one request. ``message`` is ``"Type: text"`` of the stage's exception,
    ``traceback`` the stage-side traceback text (for ``-v``)."""

    def __init__(self, request_id: Any, stage: str, message: str, traceback: str = "") -> None:
        super().__init__(f"stage {stage!r} failed on request {request_id!r}: {message}")
        self.request_id = request_id
        self.stage = stage
        self.message = message
        self.traceback = traceback

    def __reduce__(self):  # keep it picklable despite the custom signature
        return (type(self), (self.request_id, self.stage, self.message, self.traceback))
