"""muster_client: a client and a worker library for muster.

- `Client` (blocking) and `AsyncClient` (asyncio): every REST operation over
  one or several node URLs, failing over on connection errors and 5xx.
- `Worker` and `AsyncWorker`: the worker loop (registration, claim,
  heartbeats with the fencing token, complete/fail, cancel, shutdown).
- `MusterError` and its subclasses: a refused call with its problem+json.
"""

from ._async_client import AsyncClient
from ._errors import ConnectError, Conflict, MusterError, NotFound, Unavailable
from ._models import (
    TERMINAL_STATES,
    Attempt,
    BatchItem,
    Cancelled,
    ClaimedTask,
    Event,
    Finished,
    Gap,
    QueueStats,
    StatsSeries,
    Submitted,
    Task,
    TaskHeartbeat,
    TaskPage,
)
from ._sync_client import Client
from ._worker import AsyncWorker, Fail, TaskContext, Worker, WorkerStats, lease_margin

__version__ = "0.1.0"

__all__ = [
    "TERMINAL_STATES",
    "AsyncClient",
    "AsyncWorker",
    "Attempt",
    "BatchItem",
    "Cancelled",
    "ClaimedTask",
    "Client",
    "ConnectError",
    "Conflict",
    "Event",
    "Fail",
    "Finished",
    "Gap",
    "MusterError",
    "NotFound",
    "QueueStats",
    "StatsSeries",
    "Submitted",
    "Task",
    "TaskContext",
    "TaskHeartbeat",
    "TaskPage",
    "Unavailable",
    "Worker",
    "WorkerStats",
    "lease_margin",
]
