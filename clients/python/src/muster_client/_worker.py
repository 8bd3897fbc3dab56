"""The worker loop, correct by construction: an asyncio core (`AsyncWorker`)
and a blocking wrapper (`Worker`) for plain functions.

What it guarantees (README.md has the user's version):

- Registration: the worker id heartbeats into the node registry every
  `ttl_ms / 4` (through any node) before its first claim and until it
  leaves. If the process dies, the heartbeat stops and muster recovers its
  tasks within `ttl_ms` plus the cleaner's interval (G3).
- At most `concurrency` handlers run at once; a claim asks for
  `min(batch, free slots)` tasks and long-polls `poll_ms`.
- With `batch` 1 and `claim_next` (the default), each complete also claims
  the slot's next task (`next.max = 1`): one call per task instead of two,
  and never more tasks than slots (the next task takes the finished one's).
- Beside each handler a task heartbeat runs every `heartbeat_every`
  seconds with the fencing token (and the progress the handler reported).
- Claims acknowledged with no request added on the hot path: a claimed
  task must be acknowledged within its claim lease (`task.ack_ms`) or the
  server puts it back in its queue. A task finished sooner is acknowledged
  by its complete or fail; a handler still running at a third of the lease
  gets its first task heartbeat then (if `heartbeat_every` is longer),
  which acknowledges it. An adopted task is acknowledged before it starts.
- A 409 on a task heartbeat or on complete/fail means the token is stale,
  a 404 that the task is gone: the task was recovered (or timed out) and
  may run elsewhere. The handler is told (`ctx.cancelled` is set,
  `ctx.reason == "stale"`) and its result is dropped: nothing more is sent
  with that token, so there is never a second completion. A complete whose
  answer was lost and whose retry got 409 is checked against the task
  (succeeded with our token: it was ours).
- Its own lease: the worker keeps its registration lease on the monotonic
  clock, from the send time of its newest registration heartbeat that
  succeeded, until `ttl_ms` less a margin (`lease_margin`: a tenth of the
  ttl, at least 100 ms) later: the registration itself ends no earlier.
  When it lapses (no node reached), every running handler is told
  (`ctx.cancelled` set, `ctx.reason == "lease_expired"`) before the
  cluster can take the worker for dead and hand its tasks on; nothing is
  claimed and a task a late answer brings is not started, until a
  heartbeat succeeds; then the worker adopts (below). A told handler's
  outcome is still sent with its token: it counts if the task was not
  recovered meanwhile, and is refused (409, dropped) if it was. Local
  bookkeeping only: no request is added.
- A cancel request (seen on a heartbeat) sets `ctx.cancelled` with
  reason `cancel_requested`. A handler that then raises fails the task
  without retry, which muster records as `cancelled`; one that returns
  completes it with its result: the work happened (as the Rust and
  TypeScript workers, docs/workers.md).
- A handler that raises fails the task: retried by the server while attempts
  are left (`Fail(msg, retry=False)`: dead at once).
- Transient errors (connection errors, timeouts, 5xx) are retried across
  the node URLs with backoff, never 4xx.
- A claim (or a complete's next task) whose answer was lost with its node:
  after any request that failed over, the worker lists the queue's running
  tasks and runs those held under its id with a token it never started
  (`adopt`), or hands them back when no slot is free; it never starts a
  token twice. (Without it they would wait for their `timeout_ms`.)
- `stop()` (SIGTERM, SIGINT): no more claims (a long poll in flight is
  abandoned: a task it might have claimed is recovered once the worker's
  registration lapses), in-flight handlers get `grace` seconds to finish and
  are completed as usual; those still running are told (`reason ==
  "shutdown"`) and handed back with `fail` (retry), their results dropped.
  Then the worker stops heartbeating with a last short heartbeat (500 ms)
  and returns.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._async_client import AsyncClient
from ._errors import Conflict, MusterError, NotFound, Unavailable
from ._models import ClaimedTask
from ._trace import attempt_span

log = logging.getLogger("muster_client.worker")

#: The least worker ttl muster accepts (ms); the last heartbeat uses it.
MIN_TTL_MS = 500
# When the adopter looks after it is asked, in seconds (see _adopt_loop).
_ADOPT_LOOKS_S = (0.5, 2.5)


def first_heartbeat(heartbeat_every: float, ack_ms: int) -> float:
    """Seconds until a task's first heartbeat: `heartbeat_every`, or a third
    of the claim lease `ack_ms` (0: none) when that comes first, so the
    acknowledgement lands well within the lease."""
    if ack_ms <= 0:
        return heartbeat_every
    return min(heartbeat_every, ack_ms / 3000)


def lease_margin(ttl_ms: int) -> float:
    """How long (seconds) before its registration could end a worker takes
    its own lease for lapsed and tells its handlers: a tenth of the ttl, at
    least 100 ms (the handlers' time to stop before the cluster can requeue
    their tasks)."""
    return max(ttl_ms / 10_000, 0.1)


class Fail(Exception):
    """Raise from a handler to fail the task with this message; `retry=False`
    makes it dead at once instead of retried."""

    def __init__(self, message: str, *, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


class TaskContext:
    """What a handler gets besides the task: whether to stop, and a way to
    report progress (sent with the next task heartbeat)."""

    def __init__(self, task: ClaimedTask, worker_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.task = task
        self.worker_id = worker_id
        #: Set when the handler should stop: see `reason`. A threading.Event,
        #: so a blocking handler can `ctx.cancelled.wait(t)` or `.is_set()`.
        self.cancelled = threading.Event()
        #: Why `cancelled` is set: "stale" (409 or 404: the task is no longer
        #: ours, the result will be dropped), "cancel_requested" (someone
        #: cancelled the task: stop and raise, and it ends cancelled; return
        #: and it completes), "lease_expired" (the worker
        #: reached no node for its ttl less the margin, so the cluster may
        #: hand the task to another worker: stop; what the handler returns or
        #: raises is still sent with the token, and counts only if the task
        #: was not recovered meanwhile), or "shutdown" (the worker is stopping
        #: and the grace period ran out: the task was handed back).
        self.reason: str | None = None
        self._loop = loop
        self._async_cancelled = asyncio.Event()
        self._progress: int | None = None
        self._fields: dict[str, Any] | None = None
        self._reported: tuple[int | None, dict[str, Any] | None] = (None, None)
        #: The W3C `traceparent` of this attempt's span (a child of the
        #: task's trace context), or None when the task has none. Calls the
        #: handler makes through a muster client send it already.
        self.traceparent: str | None = None

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    async def wait_cancelled(self) -> None:
        """For asyncio handlers: returns once `cancelled` is set."""
        await self._async_cancelled.wait()

    def progress(self, percent: int, fields: Mapping[str, Any] | None = None) -> None:
        """Reports progress (0-100) and optional fields with the next heartbeat."""
        self._progress = max(0, min(100, int(percent)))
        if fields is not None:
            self._fields = dict(fields)

    def _cancel(self, reason: str) -> None:
        """Sets the flag (from the event loop's thread)."""
        if self.reason is None or reason == "stale":
            self.reason = reason
        self.cancelled.set()
        self._async_cancelled.set()


Handler = Callable[[ClaimedTask, TaskContext], Any]


@dataclass
class WorkerStats:
    """Counts since the worker started (read them in tests and metrics)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    #: Failed after a cancel request (the task ends cancelled; one whose
    #: handler returned counts as completed).
    cancelled: int = 0
    #: Results dropped because the token was stale (409).
    stale: int = 0
    #: Handed back (fail with retry) at shutdown after the grace period.
    handed_back: int = 0
    #: Tasks found running under this worker's id that no answer brought
    #: (a claim's answer lost with its node), run as if claimed.
    adopted: int = 0
    #: Times the worker's own registration lease lapsed (every running
    #: handler was told, reason "lease_expired").
    lease_lapses: int = 0
    transient_errors: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)


def default_worker_id() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:32]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class AsyncWorker:
    """Runs `handler(task, ctx)` for the tasks of `queue`. The handler may be
    an `async def` (run on the loop) or a plain function (run in its own
    thread). Its return value (JSON-serialisable) is the task's result."""

    def __init__(
        self,
        client: AsyncClient | str | Sequence[str],
        queue: str,
        handler: Handler,
        *,
        token: str | None = None,
        worker_id: str | None = None,
        concurrency: int = 1,
        batch: int = 1,
        poll_ms: int = 5000,
        heartbeat_every: float = 2.0,
        ttl_ms: int = 10_000,
        grace: float = 30.0,
        labels: Mapping[str, str] | None = None,
        claim_next: bool = True,
        claim_ack_ms: int | None = None,
    ) -> None:
        if concurrency < 1 or batch < 1:
            raise ValueError("concurrency and batch must be at least 1")
        if ttl_ms < MIN_TTL_MS:
            raise ValueError(f"ttl_ms must be at least {MIN_TTL_MS}")
        self.client = client if isinstance(client, AsyncClient) else AsyncClient(client, token)
        self._own_client = not isinstance(client, AsyncClient)
        self.queue = queue
        self.handler = handler
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.batch = batch
        self.poll_ms = poll_ms
        self.heartbeat_every = heartbeat_every
        self.ttl_ms = ttl_ms
        self.grace = grace
        self.labels = dict(labels or {})
        #: With batch 1, a complete also claims the slot's next task (one
        #: call per task instead of two).
        self.claim_next = claim_next
        #: The claim lease its claims ask for (1 000 to 600 000 ms; None: the
        #: server's `claim.ack_ms`).
        self.claim_ack_ms = claim_ack_ms
        self.stats = WorkerStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        #: Running tasks by token (a task's stale attempt and its next one
        #: may both be here for a moment).
        self._running: dict[int, tuple[asyncio.Task[None], TaskContext]] = {}
        #: Tokens this worker has started, so nothing is started twice
        #: (bounded: the newest 100 000).
        self._seen: collections.OrderedDict[int, None] = collections.OrderedDict()
        #: Slots asked for by the claim in flight.
        self._reserved = 0
        self._adopt_wanted: asyncio.Event | None = None
        self._slot_freed: asyncio.Event | None = None
        #: The lease: how long it lasts after a heartbeat's send time, the
        #: send time (monotonic) of the newest heartbeat that succeeded, set
        #: while it holds, and set when either changes.
        self._lease_lasts = ttl_ms / 1000 - lease_margin(ttl_ms)
        self._lease_from: float | None = None
        self._lease_holds: asyncio.Event | None = None
        self._lease_changed: asyncio.Event | None = None

    # ---- control ------------------------------------------------------------

    def stop(self) -> None:
        """Asks the worker to stop (safe from any thread and from signal handlers)."""
        self._stop_requested = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Runs until `stop()` (or SIGTERM/SIGINT when `handle_signals`)."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        if self._stop_requested:
            self._stopping.set()
        installed: list[signal.Signals] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    self._loop.add_signal_handler(sig, self.stop)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass
        self._adopt_wanted = asyncio.Event()
        self._lease_holds = asyncio.Event()
        self._lease_changed = asyncio.Event()
        self._lease_from = None
        registry = asyncio.ensure_future(self._registry_loop())
        adopter = asyncio.ensure_future(self._adopt_loop())
        lease = asyncio.ensure_future(self._lease_loop())
        try:
            await self._register()
            await self._claim_loop()
            await self._drain()
        finally:
            registry.cancel()
            adopter.cancel()
            lease.cancel()
            await asyncio.gather(registry, adopter, lease, return_exceptions=True)
            await self._leave()
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            if self._own_client:
                await self.client.aclose()

    # ---- registration -------------------------------------------------------

    async def _heartbeat_node(self, ttl_ms: int, retry_for: float) -> None:
        await self.client.heartbeat_node(
            self.worker_id,
            ttl_ms=ttl_ms,
            labels=self.labels or None,
            version="muster-client-python/0.1",
            retry_for=retry_for,
            # A stalled node must not hold the beat past the ttl: give up on
            # it after a quarter and try the next URL.
            timeout=max(0.2, self.ttl_ms / 4000),
        )

    async def _beat(self, retry_for: float) -> None:
        """One registration heartbeat; a success renews the lease from the
        time it was sent."""
        sent = time.monotonic()
        await self._heartbeat_node(self.ttl_ms, retry_for)
        self._renewed(sent)

    def _renewed(self, sent: float) -> None:
        assert self._lease_holds is not None and self._lease_changed is not None
        if self._lease_from is not None and self._lease_from >= sent:
            return
        first = self._lease_from is None
        self._lease_from = sent
        if not self._lease_holds.is_set() and time.monotonic() < sent + self._lease_lasts:
            self._lease_holds.set()
            if not first:
                # Tasks whose claims were answered while it had lapsed were
                # not started: look for them.
                self._adopt_soon()
        self._lease_changed.set()

    async def _lease_loop(self) -> None:
        """Tells every running handler when the lease lapses."""
        assert self._lease_holds is not None and self._lease_changed is not None
        while True:
            self._lease_changed.clear()
            if not self._lease_holds.is_set() or self._lease_from is None:
                await self._lease_changed.wait()
                continue
            left = self._lease_from + self._lease_lasts - time.monotonic()
            if left > 0:
                try:
                    await asyncio.wait_for(self._lease_changed.wait(), left)
                    continue  # renewed: it ends later
                except asyncio.TimeoutError:
                    pass
                if self._lease_from + self._lease_lasts > time.monotonic():
                    continue
            self._lapse()

    def _lapse(self) -> None:
        assert self._lease_holds is not None
        self._lease_holds.clear()
        self.stats.lease_lapses += 1
        log.warning("worker %s: no registration heartbeat succeeded within the lease (ttl less %.2f s): "
                    "telling every running handler to stop, claiming nothing until one does",
                    self.worker_id, lease_margin(self.ttl_ms))
        for _, ctx in list(self._running.values()):
            ctx._cancel("lease_expired")

    def _lease_ok(self) -> bool:
        return self._lease_holds is not None and self._lease_holds.is_set()

    async def _wait_any(self, *events: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _register(self) -> None:
        """Heartbeats until the registry has the worker (before any claim)."""
        assert self._stopping is not None
        delay = 0.05
        while not self._stopping.is_set():
            try:
                await self._beat(self.ttl_ms / 2000)
                return
            except Unavailable as e:
                self.stats.transient_errors += 1
                log.warning("worker %s: cannot register yet: %s", self.worker_id, e)
            await self._sleep_or_stop(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)

    async def _registry_loop(self) -> None:
        """Keeps the worker alive in the registry every ttl/4, whatever else is slow."""
        every = self.ttl_ms / 4000
        while True:
            await asyncio.sleep(every)
            try:
                await self._beat(2 * every)
            except Unavailable as e:
                self.stats.transient_errors += 1
                log.warning("worker %s: heartbeat failed: %s", self.worker_id, e)
            except MusterError as e:
                log.error("worker %s: heartbeat refused: %s", self.worker_id, e)

    async def _leave(self) -> None:
        """Removes the registration (POST /nodes/{id}/leave); if that fails, a
        last heartbeat with the shortest ttl lets it lapse at once."""
        try:
            await self.client.leave_worker(self.worker_id, retry_for=2.0, timeout=2.0)
            return
        except MusterError as e:
            log.warning("worker %s: leave failed: %s", self.worker_id, e)
        try:
            await self._heartbeat_node(MIN_TTL_MS, 2.0)
        except MusterError as e:
            log.warning("worker %s: last heartbeat failed: %s", self.worker_id, e)

    # ---- claiming -----------------------------------------------------------

    async def _sleep_or_stop(self, seconds: float) -> None:
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _claim_loop(self) -> None:
        assert self._stopping is not None and self._slot_freed is not None
        assert self._lease_holds is not None
        delay = 0.05
        while not self._stopping.is_set():
            if not self._lease_ok():
                # Nothing is claimed while the worker's own lease has lapsed.
                await self._wait_any(self._lease_holds, self._stopping)
                continue
            free = self.concurrency - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                stop = asyncio.ensure_future(self._stopping.wait())
                slot = asyncio.ensure_future(self._slot_freed.wait())
                await asyncio.wait([stop, slot], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                slot.cancel()
                continue
            self._reserved = min(self.batch, free)
            failovers = self.client.failovers
            claim = asyncio.ensure_future(
                self.client.claim(
                    self.queue, self.worker_id, max=self._reserved, wait_ms=self.poll_ms, ack_ms=self.claim_ack_ms
                )
            )
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait([claim, stop], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            self._reserved = 0
            if self.client.failovers != failovers:
                # A try failed, perhaps after the claim ran: look for tasks
                # held under our id that no answer brought.
                self._adopt_soon()
            if not claim.done():
                # Stopping: abandon the long poll. A task it claimed in the
                # instant before is recovered when the registration lapses.
                claim.cancel()
                await asyncio.gather(claim, return_exceptions=True)
                break
            try:
                tasks = claim.result()
                delay = 0.05
            except Conflict as e:
                # Not registered (lapsed) or draining: heartbeat, then retry.
                log.warning("worker %s: claim refused: %s", self.worker_id, e)
                await self._register()
                await self._sleep_or_stop(delay)
                delay = min(delay * 2, 2.0)
                continue
            except Unavailable as e:
                self.stats.transient_errors += 1
                log.warning("worker %s: claim failed: %s", self.worker_id, e)
                await self._sleep_or_stop(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 2.0)
                continue
            for t in tasks:
                self._start(t)

    def _start(self, task: ClaimedTask) -> bool:
        """Runs a task this worker holds (claimed, handed over by a complete,
        or adopted); false when that token was started already, or when the
        worker's lease has lapsed (the cluster may be handing the task to
        another worker: the adopter runs it once the lease is renewed, if it
        is still held under this worker's id)."""
        if task.token in self._seen:
            return False
        if not self._lease_ok():
            log.warning("worker %s: task %s claimed while the lease had lapsed: not started", self.worker_id, task.id)
            self._adopt_soon()
            return False
        self._seen[task.token] = None
        while len(self._seen) > 100_000:
            self._seen.popitem(last=False)
        self.stats.claimed += 1
        ctx = TaskContext(task, self.worker_id, asyncio.get_running_loop())
        runner = asyncio.ensure_future(self._run_one(task, ctx))
        self._running[task.token] = (runner, ctx)
        return True

    def _adopt_soon(self) -> None:
        if self._adopt_wanted is not None:
            self._adopt_wanted.set()

    async def _adopt_loop(self) -> None:
        assert self._adopt_wanted is not None and self._lease_holds is not None
        while True:
            await self._adopt_wanted.wait()
            self._adopt_wanted.clear()
            # Give the cluster a moment (a node was just lost), then look,
            # under a lease that holds (a task found then stays ours); look
            # again 2.5 s later, for a request held on the way longer than
            # its timeout and applied after the first look. A look that
            # fails is tried again with backoff until one succeeds.
            for wait in _ADOPT_LOOKS_S:
                backoff = 0.25
                while True:
                    await asyncio.sleep(wait)
                    await self._lease_holds.wait()
                    try:
                        await self.adopt()
                        break
                    except MusterError as e:
                        log.warning("worker %s: could not look for lost claims; looking again: %s", self.worker_id, e)
                        wait = backoff
                        backoff = min(backoff * 2, 5.0)

    async def adopt(self) -> int:
        """Runs the tasks of the queue that are running under this worker's
        id with a token it never started: a claim (or a complete's next task)
        whose answer was lost with its node. Called after a request failed
        over. A task that finds no free slot is handed back (fail, retried).
        Returns how many it started."""
        started = 0
        cursor: str | None = None
        while not self._stop_requested:
            page = await self.client.list_tasks(self.queue, "running", limit=500, cursor=cursor)
            for t in page.tasks:
                if t.owner != self.worker_id or t.token is None or t.token in self._seen:
                    continue
                if len(self._running) + self._reserved >= self.concurrency:
                    # No free slot (the claim in flight holds them): hand it
                    # back at once rather than let it wait for its timeout.
                    self._seen[t.token] = None
                    try:
                        await self.client.fail(t.id, t.token, "the claim's answer was lost; handed back", retry=True)
                        self.stats.handed_back += 1
                    except Conflict:
                        pass
                    continue
                # Acknowledged before it starts (its lease runs since the
                # claim); refused: it went back to its queue meanwhile.
                try:
                    await self.client.ack_task(t.id, t.token)
                except (Conflict, NotFound):
                    self._seen[t.token] = None
                    continue
                except Unavailable:
                    pass
                claimed = ClaimedTask(
                    id=t.id,
                    queue=t.queue,
                    token=t.token,
                    attempt=t.attempts,
                    payload=t.payload,
                    max_attempts=t.max_attempts,
                    timeout_ms=t.timeout_ms,
                    priority=t.priority,
                    created_at=t.created_at,
                    group=t.group,
                )
                if self._start(claimed):
                    log.warning("worker %s: adopted task %s (token %s): its claim's answer was lost",
                                self.worker_id, t.id, t.token)
                    self.stats.adopted += 1
                    started += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        return started

    async def _drain(self) -> None:
        """Gives in-flight handlers `grace` seconds, then hands back the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        # A complete in flight may still hand over a next task: wait for
        # whatever is running, not a list taken once.
        while self._running and loop.time() < deadline:
            running = [r for r, _ in self._running.values()]
            await asyncio.wait(running, timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
        runners = [r for r, _ in self._running.values()]
        for runner, ctx in list(self._running.values()):
            tid = ctx.task.id
            if runner.done():
                continue
            ctx._cancel("shutdown")
            runner.cancel()
            try:
                await self.client.fail(
                    tid, ctx.task.token, "the worker shut down before the task finished", retry=True
                )
                self.stats.handed_back += 1
            except MusterError as e:
                # 409: it was no longer ours anyway. Else it is recovered
                # when the registration lapses.
                log.warning("worker %s: could not hand back %s: %s", self.worker_id, tid, e)
        await asyncio.gather(*runners, return_exceptions=True)

    # ---- one task -----------------------------------------------------------

    async def _call_handler(self, task: ClaimedTask, ctx: TaskContext) -> Any:
        if inspect.iscoroutinefunction(self.handler):
            return await self.handler(task, ctx)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)

        def body() -> None:
            try:
                value = self.handler(task, ctx)
            except BaseException as e:  # noqa: BLE001 - handed to the loop
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(settle, None, e)
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(settle, value, None)

        # A daemon thread, not an executor: a handler that ignores the
        # shutdown must not keep the process from exiting. It runs in a copy
        # of this context (the attempt's traceparent, an OpenTelemetry span).
        run = contextvars.copy_context().run
        threading.Thread(target=run, args=(body,), name=f"muster-task-{task.id}", daemon=True).start()
        value = await fut
        if inspect.isawaitable(value):
            value = await value
        return value

    async def _heartbeat_task(self, task: ClaimedTask, ctx: TaskContext) -> None:
        # The first heartbeat acknowledges the claim: by a third of its lease.
        every = first_heartbeat(self.heartbeat_every, task.ack_ms)
        while True:
            await asyncio.sleep(every)
            every = self.heartbeat_every
            progress, fields = ctx._progress, ctx._fields
            send = (progress, fields) != ctx._reported
            try:
                hb = await self.client.heartbeat_task(
                    task.id,
                    task.token,
                    progress=progress if send else None,
                    fields=fields if send else None,
                )
                ctx._reported = (progress, fields)
            except (Conflict, NotFound) as e:
                log.warning("task %s: token %s is stale (%s): the handler is told to stop", task.id, task.token, e)
                ctx._cancel("stale")
                return
            except Unavailable as e:
                self.stats.transient_errors += 1
                log.warning("task %s: heartbeat failed: %s", task.id, e)
                continue
            if hb.cancel_requested and not ctx.is_cancelled:
                ctx._cancel("cancel_requested")

    async def _finish(self, kind: str, task: ClaimedTask, ctx: TaskContext, value: Any, retry: bool) -> None:
        """Sends complete or fail with the token until it is applied or
        refused; 409 marks the context stale (never a second finish)."""
        delay = 0.05
        while True:
            try:
                if kind == "complete":
                    # One call instead of two: the complete also claims this
                    # slot's next task (unless stopping, or batching).
                    chain = self.claim_next and self.batch == 1 and not self._stop_requested and self._lease_ok()
                    failovers = self.client.failovers
                    done = await self.client.complete(
                        task.id,
                        task.token,
                        value,
                        next_max=1 if chain else None,
                        next_queue=self.queue if chain else None,
                        next_ack_ms=self.claim_ack_ms if chain else None,
                    )
                    self.stats.completed += 1
                    if chain and self.client.failovers != failovers:
                        self._adopt_soon()
                    for t in done.next_tasks or []:
                        self._start(t)
                else:
                    await self.client.fail(task.id, task.token, str(value), retry=retry)
                    if ctx.reason == "cancel_requested":
                        self.stats.cancelled += 1
                    else:
                        self.stats.failed += 1
                return
            except Conflict as e:
                if await self._was_ours(task, kind):
                    # Applied on a try whose answer was lost; the retry saw 409.
                    self._adopt_soon()  # that answer may have carried a next task
                    if kind == "complete":
                        self.stats.completed += 1
                    elif ctx.reason == "cancel_requested":
                        self.stats.cancelled += 1
                    else:
                        self.stats.failed += 1
                    return
                log.warning("task %s: %s refused, token %s is stale (%s): result dropped", task.id, kind, task.token, e)
                self.stats.stale += 1
                ctx._cancel("stale")
                return
            except NotFound:
                self.stats.stale += 1
                ctx._cancel("stale")
                return
            except Unavailable as e:
                self.stats.transient_errors += 1
                log.warning("task %s: %s failed, retrying: %s", task.id, kind, e)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 2.0)

    async def _was_ours(self, task: ClaimedTask, kind: str) -> bool:
        """Whether the task's attempt with our token ended as we asked."""
        try:
            now = await self.client.get_task(task.id)
        except MusterError:
            return False
        want = {"complete": ("succeeded",), "fail": ("failed", "cancelled")}[kind]
        return any(a.token == task.token and a.outcome in want for a in now.attempt_log)

    async def _run_one(self, task: ClaimedTask, ctx: TaskContext) -> None:
        # The attempt's span: the handler and every report run inside it.
        with attempt_span(task) as tp:
            ctx.traceparent = tp
            await self._run_one_traced(task, ctx)

    async def _run_one_traced(self, task: ClaimedTask, ctx: TaskContext) -> None:
        assert self._slot_freed is not None
        self.stats.in_flight[task.id] = task.token
        beat = asyncio.ensure_future(self._heartbeat_task(task, ctx))
        try:
            try:
                value = await self._call_handler(task, ctx)
                error: BaseException | None = None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the handler's failure fails the task
                value, error = None, e
            finally:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
            if ctx.reason in ("stale", "shutdown"):
                if ctx.reason == "stale":
                    self.stats.stale += 1
                log.warning("task %s: result dropped (%s)", task.id, ctx.reason)
                return
            if error is not None:
                # After a cancel request never retried: the server records it cancelled.
                retry = ctx.reason != "cancel_requested" and (not isinstance(error, Fail) or error.retry)
                await self._finish("fail", task, ctx, f"{type(error).__name__}: {error}", retry)
            else:
                await self._finish("complete", task, ctx, value, True)
        finally:
            self.stats.in_flight.pop(task.id, None)
            self._running.pop(task.token, None)
            self._slot_freed.set()


class Worker:
    """The blocking flavour: the same loop, with a plain-function handler run
    in a thread per task. `run()` blocks until `stop()` or SIGTERM/SIGINT."""

    def __init__(
        self,
        urls: str | Sequence[str],
        queue: str,
        handler: Callable[[ClaimedTask, TaskContext], Any],
        *,
        token: str | None = None,
        **options: Any,
    ) -> None:
        self._urls = urls
        self._token = token
        self._queue = queue
        self._handler = handler
        self._options = options
        self._inner: AsyncWorker | None = None
        self._stop_early = False
        self._ready = threading.Event()

    @property
    def stats(self) -> WorkerStats:
        return self._inner.stats if self._inner is not None else WorkerStats()

    @property
    def worker_id(self) -> str | None:
        return self._inner.worker_id if self._inner is not None else self._options.get("worker_id")

    def run(self, *, handle_signals: bool = True) -> None:
        async def main() -> None:
            self._inner = AsyncWorker(
                AsyncClient(self._urls, self._token), self._queue, self._handler, **self._options
            )
            self._inner._own_client = True
            if self._stop_early:
                self._inner.stop()
            self._ready.set()
            await self._inner.run(handle_signals=handle_signals)

        asyncio.run(main())

    def stop(self) -> None:
        self._stop_early = True
        if self._inner is not None:
            self._inner.stop()


__all__ = ["AsyncWorker", "Worker", "TaskContext", "Fail", "WorkerStats", "Handler", "lease_margin"]
