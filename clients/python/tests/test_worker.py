"""The Worker against two real nodes: the proofs of issue 17.

- 1 000 tasks over two nodes while each node in turn is SIGKILLed and
  restarted: every task's handler runs exactly once, and the server has
  each task succeeded with exactly one succeeded attempt.
- A worker process SIGKILLed mid-task: the task is recovered and the second
  worker's result wins; the first worker's token is refused.
- SIGTERM during work: the in-flight tasks complete, nothing more is
  claimed, the process exits and its registration lapses.
- A stale token (the task timed out) tells the handler (ctx.reason
  "stale") and drops its result instead of completing twice.
- A cancel request tells the handler; the task ends cancelled if the
  handler then raises, and succeeded with its result if it returns.
- A worker cut from every node for twice its ttl tells its handlers
  (`lease_expired`) before another worker gets their tasks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from conftest import ADMIN_TOKEN, WORKER_TOKEN, Cluster, spawn_worker, wait_until

from muster_client import AsyncWorker, ClaimedTask, Client, Conflict, NotFound, TaskContext, Worker


def run_in_thread(w: Worker) -> threading.Thread:
    th = threading.Thread(target=w.run, kwargs={"handle_signals": False}, daemon=True)
    th.start()
    return th


def all_tasks(c: Client, queue: str, state: str) -> list[Any]:
    out: list[Any] = []
    cursor = None
    while True:
        page = c.list_tasks(queue, state, limit=500, cursor=cursor)
        out.extend(page.tasks)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def test_thousand_tasks_over_two_nodes_with_kills(cluster: Cluster, queue: str) -> None:
    n = 1000
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    busy: collections.Counter[str] = collections.Counter()
    most: collections.Counter[str] = collections.Counter()

    async def handler(task: ClaimedTask, ctx: TaskContext) -> dict[str, Any]:
        with lock:
            runs[task.id] += 1
            busy[ctx.worker_id] += 1
            most[ctx.worker_id] = max(most[ctx.worker_id], busy[ctx.worker_id])
        await asyncio.sleep(0.002)
        with lock:
            busy[ctx.worker_id] -= 1
        return {"n": task.payload["n"]}

    with Client(cluster.urls, ADMIN_TOKEN) as c:
        ids: list[str] = []
        for start in range(0, n, 500):
            # timeout_ms: a claim whose answer died with its node is recovered.
            items = c.submit_batch(queue, [{"payload": {"n": i}, "timeout_ms": 5000, "max_attempts": 5} for i in range(start, start + 500)])
            ids.extend(i.id or "" for i in items)
        assert len(set(ids)) == n

        # One claims batches; the other takes one task per slot and claims
        # the next with each complete.
        workers = [
            AsyncWorker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id=f"py-thousand-{k}",
                        concurrency=conc, batch=batch, poll_ms=500, heartbeat_every=0.5, ttl_ms=3000)
            for k, (conc, batch) in enumerate([(8, 8), (4, 1)])
        ]
        async def run_all() -> None:
            await asyncio.gather(*(w.run(handle_signals=False) for w in workers))

        th = threading.Thread(target=lambda: asyncio.run(run_all()), daemon=True)
        started = time.monotonic()
        th.start()

        def done() -> int:
            return sum(w.stats.completed for w in workers)

        for victim, at in ((0, 200), (1, 600)):
            wait_until(f"{at} completions", lambda: done() >= at, timeout=60)
            cluster.nodes[victim].kill()
            # Work goes on through the other node while this one is down.
            wait_until(f"{at + 150} completions with node {victim} down", lambda: done() >= at + 150, timeout=20)
            cluster.nodes[victim].start()
        try:
            wait_until("every task succeeded", lambda: c.get_queue(queue).succeeded == n, timeout=60)
        except AssertionError as e:
            raise AssertionError(f"{e}: {c.get_queue(queue)}, workers {[w.stats for w in workers]}") from None
        elapsed = time.monotonic() - started
        for w in workers:
            w.stop()
        th.join(15)
        assert not th.is_alive()

        assert most["py-thousand-0"] <= 8 and most["py-thousand-1"] <= 4, most
        assert all(w.stats.completed > 100 for w in workers), [w.stats for w in workers]
        twice = {t: k for t, k in runs.items() if k != 1}
        assert not twice, f"handlers ran more than once: {twice}"
        assert set(runs) == set(ids)
        assert sum(w.stats.completed for w in workers) == n
        assert sum(w.stats.stale for w in workers) == 0
        succeeded = all_tasks(c, queue, "succeeded")
        assert {t.id for t in succeeded} == set(ids)
        for t in succeeded:
            wins = [a for a in t.attempt_log if a.outcome == "succeeded"]
            assert len(wins) == 1, f"{t.id}: {t.attempt_log}"
            assert t.result == {"n": t.payload["n"]}
        failovers = sum(w.client.failovers for w in workers)
        adopted = sum(w.stats.adopted for w in workers)
        print(f"\n1000 tasks over two nodes with two node kills: {elapsed:.1f} s, {failovers} failovers, "
              f"{adopted} lost claims adopted")
        assert failovers > 0, "the kills did not exercise failover"


def test_killed_worker_task_recovered_and_second_result_wins(cluster: Cluster, queue: str, tmp_path: Path) -> None:
    out = tmp_path / "a.log"
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        sub = c.submit(queue, "job", max_attempts=3)
        a = spawn_worker(cluster.urls, queue, out, "--id", "py-killed-a", "--work", "60", "--ttl-ms", "1000")
        try:
            wait_until("worker A runs the task", lambda: out.exists() and f"start {sub.id}" in out.read_text())
            first = c.get_task(sub.id)
            assert first.state == "running" and first.owner == "py-killed-a"
            a.send_signal(signal.SIGKILL)
            a.wait()
        finally:
            a.kill()

        def handler(task: ClaimedTask, ctx: TaskContext) -> dict[str, str]:
            return {"by": "B"}

        b = Worker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-killed-b", poll_ms=500)
        th = run_in_thread(b)
        task = c.wait_for_result(sub.id, timeout=20)
        b.stop()
        th.join(10)
        assert task.state == "succeeded" and task.result == {"by": "B"}
        assert [a.outcome for a in task.attempt_log] == ["orphaned", "succeeded"]
        assert [a.node for a in task.attempt_log] == ["py-killed-a", "py-killed-b"]
        # A's late completion with its token changes nothing.
        try:
            c.complete(sub.id, first.token or 0, {"by": "A"})
            raise AssertionError("a stale completion was accepted")
        except Conflict:
            pass
        assert c.get_task(sub.id).result == {"by": "B"}


def test_sigterm_finishes_in_flight_then_leaves(cluster: Cluster, queue: str, tmp_path: Path) -> None:
    out = tmp_path / "w.log"
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        subs = [c.submit(queue, i).id for i in range(5)]
        w = spawn_worker(cluster.urls, queue, out, "--id", "py-term", "--work", "1.5", "--concurrency", "3",
                         "--grace", "20")
        try:
            wait_until("three tasks running", lambda: out.exists() and out.read_text().count("start ") == 3)
            held = [line.split()[1] for line in out.read_text().splitlines() if line.startswith("start ")]
            w.send_signal(signal.SIGTERM)
            code = w.wait(timeout=20)
        finally:
            w.kill()
        assert code == 0, Path(str(out) + ".err").read_text()
        log = out.read_text()
        assert log.count("start ") == 3, f"claimed after SIGTERM:\n{log}"
        stats = json.loads(log.splitlines()[-1].removeprefix("exit "))
        assert stats == {"completed": 3, "claimed": 3, "handed_back": 0}
        for tid in subs:
            t = c.get_task(tid)
            if tid in held:
                assert t.state == "succeeded" and t.result == {"by": "py-term"}, t
            else:
                assert t.state == "queued", t
        # It left: its registration is gone (POST /nodes/{id}/leave).
        def gone() -> bool:
            try:
                c.get_node("py-term")
                return False
            except NotFound:
                return True

        wait_until("the worker's registration is gone", gone, timeout=10)


def test_sigterm_past_grace_hands_tasks_back(cluster: Cluster, queue: str, tmp_path: Path) -> None:
    out = tmp_path / "w.log"
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        sub = c.submit(queue, "slow", max_attempts=3)
        w = spawn_worker(cluster.urls, queue, out, "--id", "py-grace", "--work", "30", "--grace", "0.5")
        try:
            wait_until("the task runs", lambda: out.exists() and "start " in out.read_text())
            w.send_signal(signal.SIGTERM)
            code = w.wait(timeout=10)
        finally:
            w.kill()
        assert code == 0
        stats = json.loads(out.read_text().splitlines()[-1].removeprefix("exit "))
        assert stats["handed_back"] == 1 and stats["completed"] == 0
        t = c.get_task(sub.id)
        assert t.state in ("queued", "delayed") and [a.outcome for a in t.attempt_log] == ["failed"], t


def test_stale_token_cancels_handler_and_never_completes_twice(cluster: Cluster, queue: str) -> None:
    seen: list[tuple[int, str | None]] = []

    def handler(task: ClaimedTask, ctx: TaskContext) -> dict[str, int]:
        if task.attempt == 1:
            # Outlives its timeout: the heartbeat's 409 must tell us.
            told = ctx.cancelled.wait(15)
            seen.append((task.attempt, ctx.reason if told else "never told"))
            return {"attempt": 1}
        seen.append((task.attempt, ctx.reason))
        return {"attempt": task.attempt}

    with Client(cluster.urls, ADMIN_TOKEN) as c:
        sub = c.submit(queue, "x", timeout_ms=1000, max_attempts=2, backoff_base_ms=10, backoff_cap_ms=10)
        w = Worker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-stale", concurrency=2,
                   poll_ms=300, heartbeat_every=0.2)
        th = run_in_thread(w)
        task = c.wait_for_result(sub.id, timeout=20)
        wait_until("both handlers returned", lambda: len(seen) == 2)
        w.stop()
        th.join(10)
        assert sorted(seen) == [(1, "stale"), (2, None)], seen
        assert task.state == "succeeded" and task.result == {"attempt": 2}
        assert [a.outcome for a in task.attempt_log] == ["timed_out", "succeeded"]
        assert w.stats.completed == 1 and w.stats.stale == 1


def test_stale_token_at_complete_drops_the_result(cluster: Cluster, queue: str) -> None:
    """No heartbeat in time: the 409 comes on complete, and nothing is retried."""
    reasons: list[str | None] = []

    def handler(task: ClaimedTask, ctx: TaskContext) -> dict[str, int]:
        if task.attempt == 1:
            time.sleep(1.6)  # timeout 1 s; heartbeats every 30 s
        reasons.append(ctx.reason)
        return {"attempt": task.attempt}

    with Client(cluster.urls, ADMIN_TOKEN) as c:
        sub = c.submit(queue, "x", timeout_ms=1000, max_attempts=2, backoff_base_ms=10, backoff_cap_ms=10)
        w = Worker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-stale-c", concurrency=2,
                   poll_ms=300, heartbeat_every=30)
        th = run_in_thread(w)
        task = c.wait_for_result(sub.id, timeout=20)
        wait_until("the first handler's result was dropped", lambda: w.stats.stale == 1)
        w.stop()
        th.join(10)
        assert task.result == {"attempt": 2}
        assert [a.outcome for a in task.attempt_log] == ["timed_out", "succeeded"]
        assert w.stats.completed == 1


def test_cancel_request_reaches_handler(cluster: Cluster, queue: str) -> None:
    """A handler told of a cancel request that raises ends its task
    cancelled (no retry); one that returns completes it (the work happened)."""
    reasons: list[str | None] = []

    async def handler(task: ClaimedTask, ctx: TaskContext) -> str:
        await asyncio.wait_for(ctx.wait_cancelled(), 15)
        reasons.append(ctx.reason)
        if task.payload == "stop":
            raise RuntimeError("stopped on request")
        return "done anyway"

    with Client(cluster.urls, ADMIN_TOKEN) as c:
        w = Worker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-cancel", poll_ms=300,
                   heartbeat_every=0.2)
        th = run_in_thread(w)
        outcomes = []
        for payload in ("stop", "finish"):
            sub = c.submit(queue, payload, max_attempts=3)
            wait_until("the task runs", lambda: c.get_task(sub.id).state == "running")
            assert c.cancel(sub.id).cancel_requested
            outcomes.append(c.wait_for_result(sub.id, timeout=10))
        w.stop()
        th.join(10)
        stopped, finished = outcomes
        assert reasons == ["cancel_requested", "cancel_requested"]
        assert stopped.state == "cancelled" and stopped.attempts == 1
        assert finished.state == "succeeded" and finished.result == "done anyway"
        assert w.stats.cancelled == 1 and w.stats.completed == 1


def test_a_claim_whose_answer_was_lost_is_adopted_once(cluster: Cluster, queue: str) -> None:
    """A task running under the worker's id that no answer brought (the
    claim's answer died with its node) is run by the worker, once."""
    release = threading.Event()
    runs: list[str] = []

    async def handler(task: ClaimedTask, ctx: TaskContext) -> str:
        runs.append(task.id)
        await asyncio.to_thread(release.wait, 10)
        return "adopted"

    async def main() -> None:
        with Client(cluster.urls, ADMIN_TOKEN) as c:
            sub = c.submit(queue, "lost")
            # A worker id belongs to the token that registers it: its claims too.
            with Client(cluster.urls, WORKER_TOKEN) as wc:
                wc.heartbeat_node("py-adopt", ttl_ms=5000)
                [lost] = wc.claim(queue, "py-adopt")  # its answer never reaches the worker
            w = AsyncWorker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-adopt", concurrency=3,
                            poll_ms=300)
            run = asyncio.ensure_future(w.run(handle_signals=False))
            await asyncio.sleep(0.5)
            assert runs == []
            assert await w.adopt() == 1
            assert await w.adopt() == 0, "adopted the same task twice"
            release.set()
            task = await asyncio.to_thread(c.wait_for_result, sub.id, 10)
            w.stop()
            await run
            assert task.result == "adopted" and task.token == lost.token
            assert runs == [sub.id] and w.stats.adopted == 1 and w.stats.completed == 1

    asyncio.run(main())


def test_a_lost_claim_without_a_free_slot_is_handed_back(cluster: Cluster, queue: str) -> None:
    async def handler(task: ClaimedTask, ctx: TaskContext) -> str:
        return "ran"

    async def main() -> None:
        with Client(cluster.urls, ADMIN_TOKEN) as c:
            sub = c.submit(queue, "lost", backoff_base_ms=60_000, backoff_cap_ms=60_000)
            # A worker id belongs to the token that registers it: its claims too.
            with Client(cluster.urls, WORKER_TOKEN) as wc:
                wc.heartbeat_node("py-adopt-full", ttl_ms=5000)
                wc.claim(queue, "py-adopt-full")
            # Its one slot is held by its long-polling claim.
            w = AsyncWorker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-adopt-full",
                            poll_ms=5000)
            run = asyncio.ensure_future(w.run(handle_signals=False))
            await asyncio.sleep(0.5)
            assert await w.adopt() == 0
            w.stop()
            await run
            t = c.get_task(sub.id)
            assert w.stats.handed_back == 1 and w.stats.claimed == 0
            assert t.state == "delayed" and [a.outcome for a in t.attempt_log] == ["failed"], t

    asyncio.run(main())


def test_a_stalled_node_does_not_let_the_registration_lapse(cluster: Cluster, queue: str) -> None:
    """The first URL's node is SIGSTOPped: the worker's heartbeats move to
    the other node in time, so its running task is not recovered from it."""
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        sub = c.submit(queue, "slow")
        reasons: list[str | None] = []

        def handler(task: ClaimedTask, ctx: TaskContext) -> str:
            ctx.cancelled.wait(3)
            reasons.append(ctx.reason)
            return "kept"

        stalled = cluster.nodes[0]
        w = Worker([stalled.url, cluster.nodes[1].url], queue, handler, token=WORKER_TOKEN,
                   worker_id="py-stalled", ttl_ms=1000, poll_ms=300, heartbeat_every=0.3)
        th = run_in_thread(w)
        wait_until("the task runs", lambda: c.get_task(sub.id).state == "running")
        assert stalled.proc is not None
        stalled.proc.send_signal(signal.SIGSTOP)
        try:
            with Client(cluster.nodes[1].url, ADMIN_TOKEN) as live:
                task = live.wait_for_result(sub.id, timeout=15)
        finally:
            stalled.proc.send_signal(signal.SIGCONT)
        w.stop()
        th.join(15)
        assert reasons == [None] and task.result == "kept", (reasons, task)
        assert [a.outcome for a in task.attempt_log] == ["succeeded"]


def test_a_worker_cut_from_every_node_stops_its_handlers_before_others_get_the_tasks(
    cluster: Cluster, queue: str
) -> None:
    """The only node a worker knows is SIGSTOPped for twice the worker's
    ttl: its registration lapses and another worker, on the other node, gets
    its tasks. The cut worker's own lease lapsed first: every handler was
    told (`lease_expired`) and had returned before the other worker started
    the task, so no task ran on two workers at once. Once the node is back,
    its reports are refused (the tasks were recovered) and it claims again."""
    n, ttl_ms = 3, 2000
    cut_node, other_node = cluster.nodes
    told: dict[str, tuple[float, str | None, float, float]] = {}
    started: dict[str, float] = {}

    async def cut_handler(task: ClaimedTask, ctx: TaskContext) -> str:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ctx.wait_cancelled(), 30)
        at = time.monotonic()
        await asyncio.sleep(0.02)  # a handler takes a moment to stop
        # Also in wall ms: this host's clock is the test Redis's, so it
        # compares with the attempt log's claimed_at.
        told[task.id] = (at, ctx.reason, time.monotonic(), time.time() * 1000)
        raise RuntimeError("stopped")

    def other_handler(task: ClaimedTask, ctx: TaskContext) -> str:
        started[task.id] = time.monotonic()
        time.sleep(0.05)
        return "other"

    with Client(other_node.url, ADMIN_TOKEN) as c:
        ids = [c.submit(queue, i).id for i in range(n)]
        cut = AsyncWorker([cut_node.url], queue, cut_handler, token=WORKER_TOKEN, worker_id="py-cut",
                          concurrency=n, batch=n, poll_ms=300, heartbeat_every=0.2, ttl_ms=ttl_ms, grace=0.5)
        cut_thread = threading.Thread(target=lambda: asyncio.run(cut.run(handle_signals=False)), daemon=True)
        cut_thread.start()
        wait_until("the cut worker runs every task",
                   lambda: all(c.get_task(i).owner == "py-cut" for i in ids) and len(cut.stats.in_flight) == n)
        other = Worker([other_node.url], queue, other_handler, token=WORKER_TOKEN, worker_id="py-other",
                       concurrency=n, poll_ms=300, heartbeat_every=0.2)
        other_thread = run_in_thread(other)
        assert cut_node.proc is not None
        cut_at = time.monotonic()
        cut_node.proc.send_signal(signal.SIGSTOP)
        claimed_again: dict[str, int] = {}
        try:
            for i in ids:
                t = c.wait_for_result(i, timeout=20)
                assert t.result == "other", t
                assert [a.node for a in t.attempt_log] == ["py-cut", "py-other"], t
                claimed_again[i] = t.attempt_log[1].claimed_at
            # Twice the ttl in all: the point of the test, not a wait.
            time.sleep(max(0.0, 2 * ttl_ms / 1000 - (time.monotonic() - cut_at)))
        finally:
            cut_node.proc.send_signal(signal.SIGCONT)
        for i in ids:
            assert i in told, f"the cut worker's handler of {i} was never told; {cut.stats}"
            at, reason, returned, returned_ms = told[i]
            assert reason == "lease_expired", (i, reason)
            assert at > cut_at, i
            assert returned_ms < claimed_again[i], \
                f"{i}: the cut worker's handler returned {returned_ms - claimed_again[i]:.0f} ms after the other's claim"
            assert returned < started[i], f"{i}: the cut worker's handler returned after the other worker started it"
            print(f"\n{i}: told {at - cut_at:.3f} s after the cut, returned "
                  f"{claimed_again[i] - returned_ms:.0f} ms before the other worker's claim")
        assert cut.stats.lease_lapses == 1, cut.stats

        # The node is back: the cut worker's fails are refused (stale), and
        # it claims again.
        wait_until("the cut worker's reports refused", lambda: cut.stats.stale == n, timeout=20)
        other.stop()
        other_thread.join(15)
        again = c.submit(queue, "again").id
        wait_until("the cut worker claims again", lambda: c.get_task(again).owner == "py-cut", timeout=20)
        # Its answer reached the worker too (the owner is set before the
        # answer is read: a stop in between leaves nothing to hand back).
        wait_until("the cut worker got the claim", lambda: cut.stats.claimed == n + 1, timeout=20)
        cut.stop()
        cut_thread.join(15)
        assert not cut_thread.is_alive()
        assert cut.stats.completed == 0 and cut.stats.handed_back == 1, cut.stats


def test_long_tasks_are_acknowledged_early_and_short_ones_by_their_complete(cluster: Cluster, queue: str) -> None:
    """The claim lease: with a 1 s lease and task heartbeats every 30 s, a
    task that runs 2.5 s is acknowledged by an early first heartbeat (by a
    third of the lease) and a short one by its complete: none goes back to
    the queue, each runs once."""
    runs: collections.Counter[str] = collections.Counter()

    async def handler(task: ClaimedTask, ctx: TaskContext) -> int:
        runs[task.id] += 1
        assert task.ack_ms == 1000
        await asyncio.sleep(task.payload["ms"] / 1000)
        return int(task.payload["ms"])

    with Client(cluster.urls, ADMIN_TOKEN) as c:
        ids = [c.submit(queue, {"ms": ms}).id for ms in (10, 2500, 20, 1800)]
        w = Worker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-acks", poll_ms=300,
                   concurrency=4, batch=4, heartbeat_every=30.0, claim_ack_ms=1000)
        th = run_in_thread(w)
        wait_until("every task succeeded", lambda: all(c.get_task(i).state == "succeeded" for i in ids), timeout=20)
        w.stop()
        th.join(10)
        assert w.stats.completed == 4 and w.stats.stale == 0, w.stats
        for i in ids:
            t = c.get_task(i)
            assert runs[i] == 1, (i, runs)
            assert t.attempts == 1, t
            assert all(a.outcome != "not_acknowledged" for a in t.attempt_log), t


def test_each_attempt_gets_a_span_in_the_tasks_trace_and_its_calls_carry_it(cluster: Cluster, queue: str) -> None:
    """Issue 39: the handler's ctx.traceparent is a child of the task's
    context (same trace, own span id), and a task the handler submits joins
    the attempt's span (the client sends it as the traceparent header)."""
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    seen: list[str | None] = []
    follow_ups: list[str] = []

    def handler(task: ClaimedTask, ctx: TaskContext) -> None:
        seen.append(ctx.traceparent)
        if task.payload == "first":
            with Client(cluster.urls, WORKER_TOKEN) as inner:
                follow_ups.append(inner.submit(queue, "second").id)

    with Client(cluster.urls, ADMIN_TOKEN) as c:
        sub = c.submit(queue, "first", traceparent=tp, tracestate="vendor=x")
        w = Worker(cluster.urls, queue, handler, token=WORKER_TOKEN, worker_id="py-trace", poll_ms=200)
        th = run_in_thread(w)
        c.wait_for_result(sub.id, timeout=20)
        wait_until("the follow-up ran", lambda: len(seen) == 2)
        w.stop()
        th.join(10)
        first = seen[0]
        assert first is not None and first.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-"), seen
        assert first.split("-")[2] != "00f067aa0ba902b7", "the attempt has a span id of its own"
        assert first.endswith("-01")
        follow = c.get_task(follow_ups[0])
        assert follow.raw.get("traceparent") == first, follow.raw
        # The follow-up's own attempt: a child of what it stored.
        assert seen[1] is not None and seen[1].split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert seen[1] != first
        task = c.get_task(sub.id)
        assert task.raw.get("traceparent") == tp and task.raw.get("tracestate") == "vendor=x"
