"""The clients against two real nodes: typed calls, errors with their
problem+json, failover on connection errors but never on 4xx, events with
`since` resume, wait_for_result, and the generated blocking client in step
with the asyncio one."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ADMIN_TOKEN, WORKER_TOKEN, Cluster, Node

from muster_client import AsyncClient, Client, Conflict, ConnectError, Event, MusterError, NotFound


def test_sync_client_is_generated_from_async() -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "unasync.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_task_round_trip_and_stale_token(cluster: Cluster, queue: str) -> None:
    with Client(cluster.urls, WORKER_TOKEN) as c:
        c.heartbeat_node("py-rt-worker", ttl_ms=5000)
        sub = c.submit(queue, {"n": 1}, max_attempts=2, idempotency_key=f"{queue}-k")
        assert sub.state == "queued" and not sub.replayed
        again = c.submit(queue, {"n": 1}, idempotency_key=f"{queue}-k")
        assert again.replayed and again.id == sub.id
        [t] = c.claim(queue, "py-rt-worker", max=5, wait_ms=1000)
        assert t.id == sub.id and t.payload == {"n": 1} and t.attempt == 1
        hb = c.heartbeat_task(t.id, t.token, progress=50)
        assert hb.state == "running" and not hb.cancel_requested
        with pytest.raises(Conflict) as stale:
            c.complete(t.id, t.token - 1, {"ok": False})
        assert stale.value.status == 409 and stale.value.request_id
        done = c.complete(t.id, t.token, {"ok": True})
        assert done.state == "succeeded"
        with pytest.raises(Conflict):
            c.complete(t.id, t.token, {"ok": "twice"})
        task = c.get_task(t.id)
        assert task.state == "succeeded" and task.result == {"ok": True} and task.progress == 100
        assert [a.outcome for a in task.attempt_log] == ["succeeded"]
        assert c.claim(queue, "py-rt-worker", wait_ms=0) == []
        stats = {q.name: q for q in c.list_queues()}[queue]
        assert stats.succeeded == 1 and stats.running == 0
        assert stats.latency_ms == 0, "nothing is waiting to be claimed"
        # The history behind the charts counts the success (once every node saw it).
        deadline = time.monotonic() + 10
        while sum(c.stats(queue=queue).succeeded) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        hour = c.stats(queue=queue)
        assert (hour.range, hour.step_s, len(hour.t), hour.queue) == ("hour", 60, 60, queue)
        assert sum(hour.succeeded) == 1 and sum(hour.dead) == 0


def test_errors_carry_problem_fields_and_4xx_is_never_retried(cluster: Cluster, queue: str, dead_url: str) -> None:
    dead = dead_url
    with Client([cluster.urls[0], dead], WORKER_TOKEN) as c:
        with pytest.raises(NotFound) as nf:
            c.get_task("0" * 26)
        assert nf.value.status == 404 and nf.value.detail and nf.value.problem["status"] == 404
        with pytest.raises(MusterError) as bad:
            c.claim(queue, "py-bad", max=5000)
        assert bad.value.status == 400 and "max" in bad.value.detail
        assert c.failovers == 0, "a 4xx went to another node"
    with Client(cluster.urls[0], "not-a-token") as c:
        with pytest.raises(MusterError) as unauth:
            c.list_queues()
        assert unauth.value.status == 401 and c.failovers == 0


def test_fails_over_past_an_unreachable_node(cluster: Cluster, queue: str, dead_url: str) -> None:
    dead = dead_url
    with Client([dead, *cluster.urls], WORKER_TOKEN, retry_for=5) as c:
        sub = c.submit(queue, 1)
        assert c.get_task(sub.id).state == "queued"
        assert c.failovers >= 1 and c.url != dead
    with Client([dead], WORKER_TOKEN, retry_for=0.5) as c:
        with pytest.raises(ConnectError):
            c.list_queues()


def test_follow_resumes_with_since_and_wait_for_result(cluster: Cluster, queue: str) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.urls, ADMIN_TOKEN) as c:
            first = [(await c.submit(queue, i)).id for i in range(3)]
            seen: list[Event] = []
            async for ev in c.follow(topics="task.enqueued", queue=queue, since="0"):
                assert isinstance(ev, Event)
                seen.append(ev)
                if len(seen) == 3:
                    break
            assert [e.task for e in seen] == first
            # Gone from the stream meanwhile: three more; resume after the last seen.
            more = [(await c.submit(queue, i)).id for i in range(3)]
            resumed: list[str] = []
            async for ev in c.follow(topics="task.enqueued", queue=queue, since=seen[-1].id):
                assert isinstance(ev, Event)
                resumed.append(ev.task or "")
                if len(resumed) == 3:
                    break
            assert resumed == more, "resume with since missed or repeated events"
            with pytest.raises(MusterError) as bad:
                async for _ in c.follow(topics="no.such.topic"):
                    pass
            assert bad.value.status == 400

    asyncio.run(main())


def test_wait_for_result(cluster: Cluster, queue: str) -> None:
    with Client(cluster.urls, WORKER_TOKEN) as c:
        c.heartbeat_node("py-wfr", ttl_ms=5000)
        sub = c.submit(queue, {"x": 2})

        def finish_later() -> None:
            with Client(cluster.urls, WORKER_TOKEN) as w:
                [t] = w.claim(queue, "py-wfr", wait_ms=5000)
                threading.Event().wait(0.5)
                w.complete(t.id, t.token, {"x2": 4})

        th = threading.Thread(target=finish_later)
        th.start()
        task = c.wait_for_result(sub.id, timeout=10, recheck=5)
        th.join()
        assert task.state == "succeeded" and task.result == {"x2": 4}
        other = c.submit(queue, 0)
        with pytest.raises(TimeoutError):
            c.wait_for_result(other.id, timeout=0.5)


def test_follow_resumes_across_a_node_kill(cluster: Cluster, queue: str) -> None:
    """The follower's node dies: it reconnects to the other with `since` =
    the last id it saw, and gets every event once, in order."""

    async def main() -> None:
        async with AsyncClient(cluster.urls, ADMIN_TOKEN) as c, AsyncClient(cluster.urls[::-1], ADMIN_TOKEN) as other:
            got: list[str] = []
            first_five = asyncio.Event()

            async def follow() -> None:
                async for ev in c.follow(topics="task.enqueued", queue=queue, since="0"):
                    assert isinstance(ev, Event)
                    got.append(ev.task or "")
                    if len(got) == 5:
                        first_five.set()
                    if len(got) == 10:
                        return

            follower = asyncio.ensure_future(follow())
            ids = [(await other.submit(queue, i)).id for i in range(5)]
            await asyncio.wait_for(first_five.wait(), 10)
            victim = cluster.nodes[0] if c.url == cluster.nodes[0].url else cluster.nodes[1]
            await asyncio.to_thread(victim.kill)
            async with AsyncClient([n.url for n in cluster.nodes if n is not victim], ADMIN_TOKEN) as live:
                ids += [(await live.submit(queue, i)).id for i in range(5, 10)]
            try:
                await asyncio.wait_for(follower, 15)
            finally:
                await asyncio.to_thread(victim.start)
            assert got == ids, "events lost or repeated across the reconnect"

    asyncio.run(main())


def test_follow_survives_a_lagging_node(cluster: Cluster, queue: str) -> None:
    """A node whose event bus holds 8 events lags every subscriber in a
    burst of enqueues; the follower resumes after the last event it yielded
    and gets each of 2 000 events once, in order."""
    node = Node(cluster.nodes[0].binary, cluster.root, 9, cluster.redis.url, extra="\n[events]\nclient_buffer = 8\n")
    node.start()
    try:

        async def main() -> None:
            async with AsyncClient([node.url], ADMIN_TOKEN) as c:
                got: list[str] = []
                ids: list[str] = []

                async def follow() -> None:
                    async for ev in c.follow(topics="task.enqueued", queue=queue, since="0"):
                        assert isinstance(ev, Event)
                        got.append(ev.task or "")
                        if len(got) == len(ids) == 2000:
                            return

                follower = asyncio.ensure_future(follow())
                for r in range(2):
                    items = await c.submit_batch(queue, [{"payload": [r, i]} for i in range(1000)])
                    ids += [it.id or "" for it in items]
                await asyncio.wait_for(follower, 30)
                assert got == ids, "events lost, repeated or out of order across the lagged reconnects"

        asyncio.run(main())
    finally:
        node.kill()


def test_other_operations_round_trip(cluster: Cluster, queue: str) -> None:
    """Locks, elections, barriers, schedules and workflows: each call's
    request shape is accepted by the real server."""
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        lock = c.acquire_lock(f"{queue}-lock", "me", ttl_ms=5000)
        with pytest.raises(Conflict) as busy:
            c.acquire_lock(f"{queue}-lock", "you", ttl_ms=5000)
        assert busy.value.problem.get("holder") is not None
        c.renew_lock(f"{queue}-lock", lock["token"], ttl_ms=5000)
        c.release_lock(f"{queue}-lock", lock["token"])
        elected = c.campaign(f"{queue}-el", "me", ttl_ms=5000)
        assert elected["elected"] is True
        c.resign(f"{queue}-el", "me")
        assert c.list_elections() is not None

        c.heartbeat_node("py-bar-a", ttl_ms=5000)
        c.put_barrier(f"{queue}-bar", ["py-bar-a"], 5000)
        arrived = c.arrive(f"{queue}-bar", "r1", "py-bar-a", wait_ms=1000)
        assert arrived["verdict"] == "released"
        assert c.get_round(f"{queue}-bar", "r1") and c.list_rounds(f"{queue}-bar")
        c.hold_barrier(f"{queue}-hold", ttl_ms=5000)
        c.release_barrier(f"{queue}-hold")
        assert c.wait_barrier(f"{queue}-hold", wait_ms=100)["held"] is False
        c.delete_barrier(f"{queue}-bar")

        sched = {"id": f"{queue}-s", "expression": "0 3 * * *", "queue": queue, "task": {"payload": 1}}
        c.create_schedule(sched)
        fired = c.trigger_schedule(f"{queue}-s", idempotency_key="k1")
        again = c.trigger_schedule(f"{queue}-s", idempotency_key="k1")
        assert fired["task"] == again["task"]
        c.disable_schedule(f"{queue}-s")
        assert c.get_schedule(f"{queue}-s", history=5)
        c.delete_schedule(f"{queue}-s")

        wf = c.start_workflow(
            [{"key": "a", "queue": queue, "payload": 1}, {"key": "b", "queue": queue, "depends_on": ["a"]}]
        )
        assert c.get_workflow(wf["id"])["state"] == "running"
        c.cancel_workflow(wf["id"])
        assert c.redis_info() and c.live() and "muster_" in c.metrics()


def test_limits_round_trip(cluster: Cluster, queue: str) -> None:
    """Flow-control limits: define, bind a queue, submit with a task's own,
    read the use back, remove."""
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        made = c.set_limit(f"{queue}-api", concurrency=1, rate_max=100, rate_per_ms=1000, rate_burst=5)
        assert made["concurrency"] == 1 and made["rate"] == {"max": 100, "per_ms": 1000, "burst": 5}
        c.set_limit(f"{queue}-tenant:*", concurrency=2)
        assert c.set_queue_limits(queue, [f"{queue}-api"])["limits"] == [f"{queue}-api"]
        sub = c.submit(queue, {"n": 1}, limits=[f"{queue}-tenant:acme"])
        assert c.get_task(sub.id).state == "queued"
        c.heartbeat_node("py-lim-worker", ttl_ms=5000)
        [t] = c.claim(queue, "py-lim-worker", max=5, wait_ms=1000)
        assert t.id == sub.id
        assert c.get_limit(f"{queue}-api")["running"] == 1
        assert c.get_limit(f"{queue}-tenant:acme")["running"] == 1
        c.complete(t.id, t.token, None)
        assert c.get_limit(f"{queue}-api")["running"] == 0
        assert {lim["name"] for lim in c.list_limits()} >= {f"{queue}-api", f"{queue}-tenant:*"}
        with pytest.raises(Conflict):
            c.submit(queue, 1, limits=["nope"])
        c.set_queue_limits(queue, [])
        c.delete_limit(f"{queue}-api")
        with pytest.raises(NotFound):
            c.get_limit(f"{queue}-api")
        # Debounce: the second submit with the key replaces the first.
        first = c.submit(queue, 1, debounce=("py-key", 60_000))
        second = c.submit(queue, 2, debounce=("py-key", 60_000))
        assert first.state == "delayed" and first.replaced is None
        assert second.replaced == first.id
        assert c.get_task(first.id).state == "cancelled"
        c.cancel(second.id)


def test_blocking_follow(cluster: Cluster, queue: str) -> None:
    with Client(cluster.urls, ADMIN_TOKEN) as c:
        ids = [c.submit(queue, i).id for i in range(2)]
        got: list[str] = []
        for ev in c.follow(topics="task.enqueued", queue=queue, since="0"):
            assert isinstance(ev, Event)
            got.append(ev.task or "")
            if len(got) == 2:
                break
        assert got == ids
