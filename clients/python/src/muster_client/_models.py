"""Typed views of the API's answers. Each keeps the JSON it came from in
`raw`, so a field added by a newer server is never lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = Any

#: Task states after which nothing more happens to a task.
TERMINAL_STATES = frozenset({"succeeded", "dead", "cancelled"})


@dataclass(frozen=True)
class ClaimedTask:
    """A task handed to a worker by a claim, with its fencing token."""

    id: str
    queue: str
    token: int
    attempt: int
    payload: JSON
    max_attempts: int
    timeout_ms: int
    priority: int
    created_at: int
    group: str | None = None
    #: The claim lease (ms): acknowledge the task within it (`ack_task`, a
    #: task heartbeat, its complete or fail) or it goes back to the queue
    #: and the token is refused. 0: no lease.
    ack_ms: int = 0
    #: The task's W3C trace context (issue 39), when its submit had one.
    traceparent: str | None = None
    tracestate: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClaimedTask:
        return cls(
            id=d["id"],
            queue=d["queue"],
            token=int(d["token"]),
            attempt=int(d["attempt"]),
            payload=d.get("payload"),
            max_attempts=int(d.get("max_attempts", 0)),
            timeout_ms=int(d.get("timeout_ms", 0)),
            priority=int(d.get("priority", 0)),
            created_at=int(d.get("created_at", 0)),
            group=d.get("group"),
            ack_ms=int(d.get("ack_ms", 0)),
            traceparent=d.get("traceparent"),
            tracestate=d.get("tracestate"),
            raw=d,
        )


@dataclass(frozen=True)
class Attempt:
    attempt: int
    node: str
    token: int
    claimed_at: int
    ended_at: int | None = None
    #: succeeded, failed, orphaned, timed_out; None while running.
    outcome: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Attempt:
        return cls(
            attempt=int(d["attempt"]),
            node=d["node"],
            token=int(d["token"]),
            claimed_at=int(d["claimed_at"]),
            ended_at=d.get("ended_at"),
            outcome=d.get("outcome"),
        )


@dataclass(frozen=True)
class Task:
    """A task as stored (GET /api/v1/tasks/{id})."""

    id: str
    queue: str
    state: str
    payload: JSON
    priority: int
    max_attempts: int
    attempts: int
    timeout_ms: int
    created_at: int
    updated_at: int
    progress: int
    cancel_requested: bool
    attempt_log: list[Attempt]
    group: str | None = None
    alias: str | None = None
    idempotency_key: str | None = None
    owner: str | None = None
    token: int | None = None
    run_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    fields: dict[str, Any] | None = None
    result: JSON = None
    error: str | None = None
    submitted_by: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        return cls(
            id=d["id"],
            queue=d["queue"],
            state=d["state"],
            payload=d.get("payload"),
            priority=int(d.get("priority", 0)),
            max_attempts=int(d.get("max_attempts", 0)),
            attempts=int(d.get("attempts", 0)),
            timeout_ms=int(d.get("timeout_ms", 0)),
            created_at=int(d.get("created_at", 0)),
            updated_at=int(d.get("updated_at", 0)),
            progress=int(d.get("progress", 0)),
            cancel_requested=bool(d.get("cancel_requested", False)),
            attempt_log=[Attempt.from_json(a) for a in d.get("attempt_log", [])],
            group=d.get("group"),
            alias=d.get("alias"),
            idempotency_key=d.get("idempotency_key"),
            owner=d.get("owner"),
            token=d.get("token"),
            run_at=d.get("run_at"),
            started_at=d.get("started_at"),
            finished_at=d.get("finished_at"),
            fields=d.get("fields"),
            result=d.get("result"),
            error=d.get("error"),
            submitted_by=d.get("submitted_by"),
            raw=d,
        )


@dataclass(frozen=True)
class Submitted:
    """The answer to a submit: `replayed` when an idempotency key returned an existing task."""

    id: str
    queue: str
    state: str
    replayed: bool
    #: The task this submit replaced (a debounce), if any.
    replaced: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Submitted:
        return cls(
            id=d["id"],
            queue=d["queue"],
            state=d["state"],
            replayed=bool(d.get("replayed", False)),
            replaced=d.get("replaced"),
        )


@dataclass(frozen=True)
class BatchItem:
    """One item of a batch submit: status created, replayed or error."""

    status: str
    id: str | None = None
    state: str | None = None
    code: int | None = None
    error: str | None = None
    replaced: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchItem:
        return cls(
            status=d["status"],
            id=d.get("id"),
            state=d.get("state"),
            code=d.get("code"),
            error=d.get("error"),
            replaced=d.get("replaced"),
        )


@dataclass(frozen=True)
class Finished:
    """The outcome of complete or fail, with the next tasks when `next` was asked for."""

    id: str
    state: str
    attempt: int
    retry_at: int | None = None
    next_tasks: list[ClaimedTask] | None = None
    next_refused: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finished:
        nxt = d.get("next")
        return cls(
            id=d["id"],
            state=d["state"],
            attempt=int(d.get("attempt", 0)),
            retry_at=d.get("retry_at"),
            next_tasks=None if nxt is None else [ClaimedTask.from_json(t) for t in nxt.get("tasks", [])],
            next_refused=None if nxt is None else nxt.get("refused"),
        )


@dataclass(frozen=True)
class TaskHeartbeat:
    """The answer to a task heartbeat: `cancel_requested` asks the worker to stop."""

    state: str
    cancel_requested: bool


@dataclass(frozen=True)
class Cancelled:
    """The answer to cancel: `cancelled`, or `running` with `cancel_requested`."""

    state: str
    cancel_requested: bool


@dataclass(frozen=True)
class QueueStats:
    name: str
    queued: int
    delayed: int
    running: int
    dead: int
    succeeded: int
    cancelled: int
    paused: bool
    finished_last_minute: int
    #: How long the longest-waiting head of the queue has been claimable (ms).
    latency_ms: int = 0
    #: Only from get_queue: groups with queued tasks here or a limit.
    groups: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueStats:
        return cls(
            name=d["name"],
            queued=int(d.get("queued", 0)),
            delayed=int(d.get("delayed", 0)),
            running=int(d.get("running", 0)),
            dead=int(d.get("dead", 0)),
            succeeded=int(d.get("succeeded", 0)),
            cancelled=int(d.get("cancelled", 0)),
            paused=bool(d.get("paused", False)),
            finished_last_minute=int(d.get("finished_last_minute", 0)),
            latency_ms=int(d.get("latency_ms", 0)),
            groups=list(d.get("groups", [])),
        )


@dataclass(frozen=True)
class StatsSeries:
    """The outcome history of `GET /api/v1/stats`, column by column, oldest first."""

    #: "hour" (one point per minute) or "month" (one per UTC day).
    range: str
    step_s: int
    #: The queue, or None for all queues.
    queue: str | None
    #: The start of each point, Unix seconds.
    t: list[int]
    succeeded: list[int]
    #: Failed attempts.
    failed: list[int]
    dead: list[int]
    #: The largest queued count sampled in each step.
    queued: list[int]
    #: The largest queue latency sampled in each step (ms).
    latency_ms: list[int]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StatsSeries:
        def col(k: str) -> list[int]:
            return [int(v) for v in d.get(k, [])]

        return cls(
            range=d["range"],
            step_s=int(d["step_s"]),
            queue=d.get("queue"),
            t=col("t"),
            succeeded=col("succeeded"),
            failed=col("failed"),
            dead=col("dead"),
            queued=col("queued"),
            latency_ms=col("latency_ms"),
        )


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    #: Pass as `cursor` for the next page; None on the last page.
    next_cursor: str | None
    #: Tasks in this state in total.
    total: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TaskPage:
        return cls(
            tasks=[Task.from_json(t) for t in d.get("tasks", [])],
            next_cursor=d.get("next_cursor"),
            total=int(d.get("total", 0)),
        )


@dataclass(frozen=True)
class Event:
    """One event of the cluster stream (see docs/concepts.md#events)."""

    id: str
    type: str
    ts: int
    node: str | None
    task: str | None
    queue: str | None
    data: dict[str, Any]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Event:
        return cls(
            id=d["id"],
            type=d["type"],
            ts=int(d.get("ts", 0)),
            node=d.get("node"),
            task=d.get("task"),
            queue=d.get("queue"),
            data=d.get("data") or {},
            raw=d,
        )


@dataclass(frozen=True)
class Gap:
    """Events after the asked `since` were already trimmed; `oldest` is the oldest retained."""

    oldest: str
