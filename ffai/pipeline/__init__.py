"""The staged pipeline runtime (DESIGN §4), after SGLang-Omni's Stage/Scheduler split.

- :mod:`~ffai.pipeline.scheduler`: compute. ``SimpleScheduler`` (function or batch
  function, with a batching window), ``ContinuousScheduler`` (requests served together a step
  at a time), ``StreamingScheduler`` (consumes stream chunks),
  ``emit(chunk)`` for a stage function that streams.
- :mod:`~ffai.pipeline.stage`: the IO shell around one scheduler (routing, projection,
  fan-in, streaming, aborts).
- :mod:`~ffai.pipeline.config`: ``PipelineConfig`` / ``StageConfig`` / ``ProcessConfig``,
  validated before any worker starts.
- :mod:`~ffai.pipeline.runner`: worker processes (spawn) or inline threads.
- :mod:`~ffai.pipeline.coordinator`: ``Coordinator`` — ``submit``, ``stream``, ``abort``,
  ``as_completed``, bounded requests in flight.

The pipeline knows no engine; stages come from ``"module:function"`` factories. torch is
imported only where tensors or thread counts need it.
"""

from __future__ import annotations

from ffai.pipeline.config import PipelineConfig, ProcessConfig, StageConfig
from ffai.pipeline.coordinator import Coordinator, RequestFuture, RequestStream
from ffai.pipeline.errors import (
    ConfigError,
    PipelineError,
    PipelineStartError,
    RequestAborted,
    StageError,
    WorkerDied,
)
from ffai.pipeline.messages import CALLER, Message
from ffai.pipeline.scheduler import (
    ContinuousScheduler,
    ContinuousWrapper,
    Scheduler,
    SimpleScheduler,
    StreamingScheduler,
    StreamState,
    emit,
    emitter,
    is_continuous,
)

__all__ = [
    "CALLER",
    "ConfigError",
    "ContinuousScheduler",
    "ContinuousWrapper",
    "Coordinator",
    "Message",
    "PipelineConfig",
    "PipelineError",
    "PipelineStartError",
    "ProcessConfig",
    "RequestAborted",
    "RequestFuture",
    "RequestStream",
    "Scheduler",
    "SimpleScheduler",
    "StageConfig",
    "StageError",
    "StreamState",
    "StreamingScheduler",
    "WorkerDied",
    "emit",
    "emitter",
    "is_continuous",
]
