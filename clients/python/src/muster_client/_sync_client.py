"""The blocking client (generated from _async_client.py: do not edit): every REST operation over one or several node URLs.

`_sync_client.py` is generated from this file by `scripts/unasync.py`
(async/removed, httpx.Client -> httpx.Client, ...); edit this
one and run `python scripts/unasync.py`. A test fails when they differ.

Failover: a request goes to the node that answered last. A connection
error, a timeout or a 5xx moves it to the next URL at once; after every URL
failed once in a row it backs off (exponential with jitter, `backoff_base`
to `backoff_cap` seconds) and goes round again, until `retry_for` seconds
have passed; then the last error is raised. A 4xx is the answer: it is
raised at once as a MusterError and never retried. Retrying is safe: a 503
from muster means not applied or unknown (docs/api.md), heartbeat, complete
and fail are fenced by the token (a second one gets 409), and `submit`
sends an idempotency key (a random one unless given).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import random
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from . import _compat_sync as _compat
from . import _trace
from ._errors import ConnectError, MusterError, Unavailable, error_for
from ._models import (
    TERMINAL_STATES,
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

_UNSET: Any = object()


def _p(segment: str) -> str:
    """One path segment, escaped."""
    return quote(segment, safe="")


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _problem(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"title": resp.reason_phrase, "detail": resp.text[:500]}


class Client:
    """A muster client. `urls` is one base URL or several (any node of the
    cluster will do); `token` is a bearer token (docs/configuration.md)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retry_for: float = 30.0,
        backoff_base: float = 0.05,
        backoff_cap: float = 2.0,
    ) -> None:
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("at least one node URL is needed")
        self.token = token
        self.timeout = timeout
        self.retry_for = retry_for
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        headers = {"user-agent": "muster-client-python/0.1"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.Client(headers=headers, timeout=timeout)
        self._current = 0
        #: Requests sent to another URL after an error (for tests and metrics).
        self.failovers = 0

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        """The node requests go to now."""
        return self.urls[self._current]

    def _next_url(self) -> None:
        self._current = (self._current + 1) % len(self.urls)
        self.failovers += 1

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = _UNSET,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        wait_ms: int = 0,
        retry: bool = True,
        retry_for: float | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """Sends one request with failover; returns a 2xx or 3xx response,
        raises MusterError for 4xx at once and for 5xx or connection errors
        once the retry budget is spent. `wait_ms` lengthens the read timeout
        for a long poll; `timeout` replaces the client's for this call."""
        budget = self.retry_for if retry_for is None else retry_for
        deadline = time.monotonic() + budget
        delay = self.backoff_base
        failed_in_row = 0
        q = _drop_none(params or {})
        timeout = (self.timeout if timeout is None else timeout) + wait_ms / 1000.0
        traceparent = _trace.current_traceparent.get()
        if traceparent is not None:
            headers = {**(headers or {}), "traceparent": traceparent}
        while True:
            url = self.urls[self._current] + path
            err: MusterError
            try:
                if json is _UNSET:
                    resp = self._http.request(method, url, params=q, headers=headers, timeout=timeout)
                else:
                    resp = self._http.request(
                        method, url, params=q, headers=headers, json=json, timeout=timeout
                    )
            except httpx.TransportError as e:
                err = ConnectError(f"{type(e).__name__}: {e}", method, url)
            else:
                if resp.status_code < 400:
                    return resp
                err = error_for(resp.status_code, _problem(resp), method, url)
                if resp.status_code < 500:
                    raise err
            # The next call, or the next try, goes to the next node.
            self._next_url()
            if not retry or time.monotonic() >= deadline:
                raise err
            failed_in_row += 1
            if failed_in_row % len(self.urls) == 0:
                pause = min(delay * random.uniform(0.5, 1.0), max(0.0, deadline - time.monotonic()))
                _compat.sleep(pause)
                delay = min(delay * 2, self.backoff_cap)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    # ---- system and nodes -------------------------------------------------

    def healthz(self) -> bool:
        resp = self.request("GET", "/healthz", retry=False)
        return resp.status_code == 200

    def openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/openapi.json")
        return out

    def readyz(self) -> bool:
        """Whether the node requests go to now is ready (no failover: it asks that node)."""
        resp = self._http.get(self.url + "/readyz")
        return resp.status_code == 200

    def redis_info(self) -> dict[str, Any]:
        """Redis mode, address, version, role, latency, keys, memory."""
        out: dict[str, Any] = self._json("GET", "/api/v1/redis")
        return out

    def failover_status(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/failover")
        return out

    def live(self) -> dict[str, Any]:
        """The node's cached live view: node states, queue counts, orphan totals, throughput."""
        out: dict[str, Any] = self._json("GET", "/api/v1/live")
        return out

    def stats(self, range: str = "hour", queue: str | None = None) -> StatsSeries:
        """The outcome history behind the dashboard's charts: succeeded, failed and dead per
        minute over the last hour (range="hour") or per day over 30 days (range="month"),
        for one queue or all."""
        params = {"range": range, "queue": queue}
        return StatsSeries.from_json(self._json("GET", "/api/v1/stats", params=params))

    def metrics(self) -> str:
        """The Prometheus text of the node requests go to."""
        return (self.request("GET", "/metrics")).text

    def heartbeat_node(
        self,
        node: str,
        *,
        ttl_ms: int | None = None,
        labels: Mapping[str, str] | None = None,
        addr: str | None = None,
        version: str | None = None,
        retry_for: float | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """An external worker joins or stays alive (PUT /nodes/{id}/heartbeat)."""
        body = _drop_none({"ttl_ms": ttl_ms, "labels": dict(labels) if labels else None, "addr": addr, "version": version})
        out: dict[str, Any] = self._json(
            "PUT", f"/api/v1/nodes/{_p(node)}/heartbeat", json=body, retry_for=retry_for, timeout=timeout
        )
        return out

    def list_nodes(self) -> list[dict[str, Any]]:
        out = self._json("GET", "/api/v1/nodes")
        nodes: list[dict[str, Any]] = out.get("nodes", []) if isinstance(out, dict) else out
        return nodes

    def get_node(self, node: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/nodes/{_p(node)}")
        return out

    def drain_node(self, node: str) -> None:
        self.request("POST", f"/api/v1/nodes/{_p(node)}/drain")

    def delete_node(self, node: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{_p(node)}")

    def leave_worker(self, node: str, *, retry_for: float | None = None, timeout: float | None = None) -> None:
        """A worker leaves (worker role; POST /nodes/{id}/leave): its registration goes."""
        self.request("POST", f"/api/v1/nodes/{_p(node)}/leave", retry_for=retry_for, timeout=timeout)

    # ---- tasks and queues -------------------------------------------------

    def submit(
        self,
        queue: str,
        payload: Any = None,
        *,
        group: str | None = None,
        priority: int | None = None,
        delay_ms: int | None = None,
        run_at: int | None = None,
        max_attempts: int | None = None,
        timeout_ms: int | None = None,
        alias: str | None = None,
        idempotency_key: str | None = None,
        backoff_base_ms: int | None = None,
        backoff_cap_ms: int | None = None,
        limits: Sequence[str] | None = None,
        debounce: tuple[str, int] | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Submitted:
        """Submits a task. Without `idempotency_key` a random one is sent, so
        a retry after a lost answer never creates the task twice. `limits`:
        flow-control limits of its own (`["tenant:acme"]`), on top of its
        queue's. `debounce`: (key, ms): only the newest task per key waits,
        and runs `ms` after the last submit with that key; the answer's
        `replaced` names the task this one replaced. `traceparent` (and
        `tracestate`): the W3C trace the task joins; inside a worker's
        handler the attempt's is sent without it."""
        body = _drop_none(
            {
                "payload": payload,
                "group": group,
                "priority": priority,
                "delay_ms": delay_ms,
                "run_at": run_at,
                "max_attempts": max_attempts,
                "timeout_ms": timeout_ms,
                "alias": alias,
                "idempotency_key": idempotency_key or uuid.uuid4().hex,
                "backoff_base_ms": backoff_base_ms,
                "backoff_cap_ms": backoff_cap_ms,
                "limits": list(limits) if limits is not None else None,
                "debounce": {"key": debounce[0], "ms": debounce[1]} if debounce is not None else None,
                "traceparent": traceparent,
                "tracestate": tracestate,
            }
        )
        return Submitted.from_json(self._json("POST", f"/api/v1/queues/{_p(queue)}/tasks", json=body))

    def submit_batch(self, queue: str, tasks: Sequence[Mapping[str, Any]]) -> list[BatchItem]:
        """Submits up to 1 000 task specs (dicts with the fields of `submit`)
        in one script. Each spec without an idempotency key gets a random
        one, so a retry creates nothing twice."""
        specs = [dict(t) if "idempotency_key" in t else {**t, "idempotency_key": uuid.uuid4().hex} for t in tasks]
        out = self._json("POST", f"/api/v1/queues/{_p(queue)}/tasks/batch", json={"tasks": specs})
        return [BatchItem.from_json(r) for r in out["results"]]

    def claim(
        self, queue: str, node: str, *, max: int = 1, wait_ms: int = 0, ack_ms: int | None = None
    ) -> list[ClaimedTask]:
        """Claims up to `max` tasks for worker `node`, long-polling up to
        `wait_ms`; an empty list when none came. Each task must be
        acknowledged within its `ack_ms` (the claim lease: `ack_ms` here,
        1 000 to 600 000, or the server's `claim.ack_ms`)."""
        resp = self.request(
            "POST",
            f"/api/v1/queues/{_p(queue)}/claim",
            json=_drop_none({"node": node, "max": max, "wait_ms": wait_ms, "ack_ms": ack_ms}),
            wait_ms=wait_ms,
        )
        if resp.status_code == 204:
            return []
        return [ClaimedTask.from_json(t) for t in resp.json()["tasks"]]

    def heartbeat_task(
        self, task_id: str, token: int, *, progress: int | None = None, fields: Mapping[str, Any] | None = None
    ) -> TaskHeartbeat:
        """Reports the task is still being worked on; 409 (Conflict) when the
        token is stale. `cancel_requested` asks the worker to stop."""
        body = _drop_none({"token": token, "progress": progress, "fields": dict(fields) if fields else None})
        out = self._json("POST", f"/api/v1/tasks/{_p(task_id)}/heartbeat", json=body)
        return TaskHeartbeat(state=out["state"], cancel_requested=bool(out["cancel_requested"]))

    def ack_task(self, task_id: str, token: int) -> TaskHeartbeat:
        """Acknowledges a claim: its lease ends (a task heartbeat, a complete
        or a fail does the same). 409 (Conflict): the token is stale, the
        task went back to its queue or runs under a newer claim."""
        out = self._json("POST", f"/api/v1/tasks/{_p(task_id)}/ack", json={"token": token})
        return TaskHeartbeat(state=out["state"], cancel_requested=bool(out["cancel_requested"]))

    @staticmethod
    def _next(
        max: int | None, queue: str | None, wait_ms: int | None, ack_ms: int | None = None
    ) -> dict[str, Any] | None:
        if max is None and queue is None and wait_ms is None and ack_ms is None:
            return None
        return _drop_none({"max": max, "queue": queue, "wait_ms": wait_ms, "ack_ms": ack_ms})

    def complete(
        self,
        task_id: str,
        token: int,
        result: Any = None,
        *,
        next_max: int | None = None,
        next_queue: str | None = None,
        next_wait_ms: int | None = None,
        next_ack_ms: int | None = None,
    ) -> Finished:
        """Completes a task with its token; 409 (Conflict) when the token is
        stale. `next_*` claims the worker's next task(s) in the same call
        (`next_ack_ms`: their claim lease)."""
        nxt = self._next(next_max, next_queue, next_wait_ms, next_ack_ms)
        body = _drop_none({"token": token, "result": result, "next": nxt})
        out = self._json(
            "POST", f"/api/v1/tasks/{_p(task_id)}/complete", json=body, wait_ms=next_wait_ms or 0
        )
        return Finished.from_json(out)

    def complete_batch(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Completes several tasks: items `{"id", "token", "result"}`; per-item results."""
        out: dict[str, Any] = self._json("POST", "/api/v1/tasks/complete", json=list(items))
        return out

    def fail(
        self,
        task_id: str,
        token: int,
        error: str = "",
        *,
        retry: bool = True,
        next_max: int | None = None,
        next_queue: str | None = None,
        next_wait_ms: int | None = None,
        next_ack_ms: int | None = None,
    ) -> Finished:
        """Fails a task with its token: retried after a backoff while attempts
        are left (unless `retry=False`), else dead; cancelled if a cancel was
        requested. 409 (Conflict) when the token is stale."""
        nxt = self._next(next_max, next_queue, next_wait_ms, next_ack_ms)
        body = _drop_none({"token": token, "error": error, "retry": retry, "next": nxt})
        out = self._json("POST", f"/api/v1/tasks/{_p(task_id)}/fail", json=body, wait_ms=next_wait_ms or 0)
        return Finished.from_json(out)

    def cancel(self, task_id: str) -> Cancelled:
        """Cancels a queued or delayed task; asks a running one to stop."""
        out = self._json("POST", f"/api/v1/tasks/{_p(task_id)}/cancel")
        return Cancelled(state=out["state"], cancel_requested=bool(out["cancel_requested"]))

    def retry_task(self, task_id: str) -> dict[str, Any]:
        """Requeues a dead task with fresh attempts (admin)."""
        out: dict[str, Any] = self._json("POST", f"/api/v1/tasks/{_p(task_id)}/retry")
        return out

    def get_task(self, task_id: str) -> Task:
        return Task.from_json(self._json("GET", f"/api/v1/tasks/{_p(task_id)}"))

    def delete_task(self, task_id: str) -> None:
        self.request("DELETE", f"/api/v1/tasks/{_p(task_id)}")

    def get_alias(self, alias: str) -> Task:
        return Task.from_json(self._json("GET", f"/api/v1/aliases/{_p(alias)}"))

    def list_queues(self) -> list[QueueStats]:
        out = self._json("GET", "/api/v1/queues")
        return [QueueStats.from_json(q) for q in out["queues"]]

    def get_queue(self, queue: str) -> QueueStats:
        """One queue's counts, with its groups."""
        return QueueStats.from_json(self._json("GET", f"/api/v1/queues/{_p(queue)}"))

    def list_tasks(
        self, queue: str, state: str, *, limit: int | None = None, cursor: str | None = None
    ) -> TaskPage:
        params = {"state": state, "limit": limit, "cursor": cursor}
        return TaskPage.from_json(self._json("GET", f"/api/v1/queues/{_p(queue)}/tasks", params=params))

    def pause_queue(self, queue: str) -> None:
        self.request("POST", f"/api/v1/queues/{_p(queue)}/pause")

    def resume_queue(self, queue: str) -> None:
        self.request("POST", f"/api/v1/queues/{_p(queue)}/resume")

    def list_dead(self, *, limit: int | None = None, cursor: str | None = None) -> TaskPage:
        return TaskPage.from_json(self._json("GET", "/api/v1/dead", params={"limit": limit, "cursor": cursor}))

    def list_groups(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/groups")
        return out

    def set_group_limit(self, group: str, limit: int | None) -> dict[str, Any]:
        """Sets (or with None removes) a group's cluster-wide concurrency limit."""
        out: dict[str, Any] = self._json("PUT", f"/api/v1/groups/{_p(group)}", json={"limit": limit})
        return out

    # ---- flow-control limits (G13) ------------------------------------------

    def list_limits(self) -> list[dict[str, Any]]:
        """Every limit and template, with its use (running, tokens, waiting)."""
        out: dict[str, Any] = self._json("GET", "/api/v1/limits")
        limits: list[dict[str, Any]] = out["limits"]
        return limits

    def get_limit(self, name: str) -> dict[str, Any]:
        """A limit, a template (`name:*`) or a template's key (`name:key`)."""
        out: dict[str, Any] = self._json("GET", f"/api/v1/limits/{_p(name)}")
        return out

    def set_limit(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate_max: int | None = None,
        rate_per_ms: int | None = None,
        rate_burst: int | None = None,
    ) -> dict[str, Any]:
        """Defines or changes a limit or template (admin): a concurrency, a
        rate (`rate_max` tokens per `rate_per_ms`, `rate_burst` saved up,
        default 1), or both."""
        rate = None
        if rate_max is not None or rate_per_ms is not None:
            rate = {"max": rate_max, "per_ms": rate_per_ms, "burst": 1 if rate_burst is None else rate_burst}
        out: dict[str, Any] = self._json(
            "PUT", f"/api/v1/limits/{_p(name)}", json={"concurrency": concurrency, "rate": rate}
        )
        return out

    def delete_limit(self, name: str) -> None:
        """Removes a limit or template (admin)."""
        self.request("DELETE", f"/api/v1/limits/{_p(name)}")

    def set_queue_limits(self, queue: str, limits: Sequence[str]) -> dict[str, Any]:
        """Sets the limits that bind every task of `queue` (admin); [] removes them."""
        out: dict[str, Any] = self._json(
            "PUT", f"/api/v1/queues/{_p(queue)}/limits", json={"limits": list(limits)}
        )
        return out

    def orphans(self, *, limit: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/orphans", params={"limit": limit})
        return out

    # ---- workflows ----------------------------------------------------------

    def start_workflow(
        self,
        tasks: Sequence[Mapping[str, Any]],
        *,
        failure_policy: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Starts a DAG: `tasks` are dicts with `key`, `queue`, `depends_on`,
        `payload` and task options (docs/concepts.md#workflows)."""
        body = _drop_none(
            {
                "tasks": [dict(t) for t in tasks],
                "failure_policy": failure_policy,
                "idempotency_key": idempotency_key or uuid.uuid4().hex,
            }
        )
        out: dict[str, Any] = self._json("POST", "/api/v1/workflows", json=body)
        return out

    def get_workflow(self, workflow_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/workflows/{_p(workflow_id)}")
        return out

    def list_workflows(
        self, *, state: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        params = {"state": state, "limit": limit, "cursor": cursor}
        out: dict[str, Any] = self._json("GET", "/api/v1/workflows", params=params)
        return out

    def cancel_workflow(self, workflow_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("POST", f"/api/v1/workflows/{_p(workflow_id)}/cancel")
        return out

    # ---- schedules ----------------------------------------------------------

    def list_schedules(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/schedules")
        return out

    def get_schedule(self, schedule_id: str, *, history: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = self._json(
            "GET", f"/api/v1/schedules/{_p(schedule_id)}", params={"history": history}
        )
        return out

    def create_schedule(self, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """Creates a schedule (409 if its id exists): `id`, `expression`, `queue`, `task`, ..."""
        out: dict[str, Any] = self._json("POST", "/api/v1/schedules", json=dict(schedule))
        return out

    def put_schedule(self, schedule_id: str, schedule: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._json("PUT", f"/api/v1/schedules/{_p(schedule_id)}", json=dict(schedule))
        return out

    def delete_schedule(self, schedule_id: str, *, force: bool | None = None) -> None:
        params = {"force": None if force is None else str(force).lower()}
        self.request("DELETE", f"/api/v1/schedules/{_p(schedule_id)}", params=params)

    def trigger_schedule(self, schedule_id: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Fires a schedule now; the key (random unless given) makes a retry return the first call's task."""
        headers = {"idempotency-key": idempotency_key or uuid.uuid4().hex}
        out: dict[str, Any] = self._json(
            "POST", f"/api/v1/schedules/{_p(schedule_id)}/trigger", headers=headers
        )
        return out

    def enable_schedule(self, schedule_id: str) -> None:
        self.request("POST", f"/api/v1/schedules/{_p(schedule_id)}/enable")

    def disable_schedule(self, schedule_id: str) -> None:
        self.request("POST", f"/api/v1/schedules/{_p(schedule_id)}/disable")

    # ---- barriers -----------------------------------------------------------

    def put_barrier(
        self, name: str, participants: Sequence[str], timeout_ms: int, *, max_missing: int = 0
    ) -> dict[str, Any]:
        body = {"participants": list(participants), "max_missing": max_missing, "timeout_ms": timeout_ms}
        out: dict[str, Any] = self._json("PUT", f"/api/v1/barriers/{_p(name)}", json=body)
        return out

    def get_barrier(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/barriers/{_p(name)}")
        return out

    def list_barriers(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/barriers")
        return out

    def delete_barrier(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/barriers/{_p(name)}")

    def arrive(self, name: str, round: str, node: str, *, wait_ms: int = 0) -> dict[str, Any]:
        """Arrives at a barrier round; `verdict` is released, aborted or pending."""
        out: dict[str, Any] = self._json(
            "POST",
            f"/api/v1/barriers/{_p(name)}/rounds/{_p(round)}/arrive",
            json={"node": node, "wait_ms": wait_ms},
            wait_ms=wait_ms,
        )
        return out

    def list_rounds(self, name: str, *, limit: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/barriers/{_p(name)}/rounds", params={"limit": limit})
        return out

    def get_round(self, name: str, round: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/barriers/{_p(name)}/rounds/{_p(round)}")
        return out

    def hold_barrier(self, name: str, *, holder: str | None = None, ttl_ms: int | None = None) -> dict[str, Any]:
        body = _drop_none({"holder": holder, "ttl_ms": ttl_ms})
        out: dict[str, Any] = self._json("POST", f"/api/v1/barriers/{_p(name)}/hold", json=body)
        return out

    def release_barrier(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("POST", f"/api/v1/barriers/{_p(name)}/release")
        return out

    def wait_barrier(self, name: str, *, wait_ms: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = self._json(
            "POST", f"/api/v1/barriers/{_p(name)}/wait", json={"wait_ms": wait_ms}, wait_ms=wait_ms
        )
        return out

    def enter_double_barrier(self, name: str, node: str, count: int, *, wait_ms: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = self._json(
            "POST",
            f"/api/v1/double-barriers/{_p(name)}/enter",
            json={"node": node, "count": count, "wait_ms": wait_ms},
            wait_ms=wait_ms,
        )
        return out

    def leave_double_barrier(self, name: str, node: str, *, wait_ms: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = self._json(
            "POST",
            f"/api/v1/double-barriers/{_p(name)}/leave",
            json={"node": node, "wait_ms": wait_ms},
            wait_ms=wait_ms,
        )
        return out

    def list_double_barriers(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/double-barriers")
        return out

    def get_double_barrier(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/double-barriers/{_p(name)}")
        return out

    # ---- locks and elections ------------------------------------------------

    def acquire_lock(
        self, name: str, owner: str, *, ttl_ms: int | None = None, wait_ms: int | None = None, node: str | None = None
    ) -> dict[str, Any]:
        """Acquires a fenced lock: the answer carries its `token`; 409 (busy)
        with `holder` and `position`. Not retried after an unknown outcome
        (a lost answer could leave the lock held until its ttl)."""
        body = _drop_none({"owner": owner, "ttl_ms": ttl_ms, "wait_ms": wait_ms, "node": node})
        out: dict[str, Any] = self._json(
            "POST", f"/api/v1/locks/{_p(name)}/acquire", json=body, wait_ms=wait_ms or 0
        )
        return out

    def renew_lock(self, name: str, token: int, *, ttl_ms: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = self._json(
            "POST", f"/api/v1/locks/{_p(name)}/renew", json=_drop_none({"token": token, "ttl_ms": ttl_ms})
        )
        return out

    def release_lock(self, name: str, token: int) -> dict[str, Any] | None:
        out: dict[str, Any] | None = self._json(
            "POST", f"/api/v1/locks/{_p(name)}/release", json={"token": token}
        )
        return out

    def get_lock(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/locks/{_p(name)}")
        return out

    def list_locks(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/locks")
        return out

    def break_lock(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/locks/{_p(name)}")

    def campaign(
        self,
        name: str,
        candidate: str,
        *,
        ttl_ms: int | None = None,
        wait_ms: int | None = None,
        value: Any = None,
    ) -> dict[str, Any]:
        body = _drop_none({"candidate": candidate, "ttl_ms": ttl_ms, "wait_ms": wait_ms, "value": value})
        out: dict[str, Any] = self._json(
            "POST", f"/api/v1/elections/{_p(name)}/campaign", json=body, wait_ms=wait_ms or 0
        )
        return out

    def resign(self, name: str, candidate: str, *, epoch: int | None = None) -> dict[str, Any] | None:
        out: dict[str, Any] | None = self._json(
            "POST", f"/api/v1/elections/{_p(name)}/resign", json=_drop_none({"candidate": candidate, "epoch": epoch})
        )
        return out

    def get_election(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", f"/api/v1/elections/{_p(name)}")
        return out

    def list_elections(self) -> dict[str, Any]:
        out: dict[str, Any] = self._json("GET", "/api/v1/elections")
        return out

    # ---- events -------------------------------------------------------------

    def events(
        self,
        *,
        since: str | None = None,
        limit: int | None = None,
        topics: str | None = None,
        queue: str | None = None,
    ) -> dict[str, Any]:
        """One page of the event replay over HTTP: `events`, `next` (pass as `since`), `gap`."""
        params = {"since": since, "limit": limit, "topics": topics, "queue": queue}
        out: dict[str, Any] = self._json("GET", "/api/v1/events", params=params)
        return out

    def _ws_url(self, base: str, topics: str | None, queue: str | None, since: str | None) -> str:
        q = urlencode(_drop_none({"topics": topics, "queue": queue, "since": since}))
        scheme_base = "ws" + base[len("http") :] if base.startswith("http") else base
        return f"{scheme_base}/api/v1/events/ws" + (f"?{q}" if q else "")

    def follow(
        self,
        *,
        topics: str | None = None,
        queue: str | None = None,
        since: str | None = None,
        gaps: bool = False,
    ) -> Iterator[Event | Gap]:
        """Follows the event stream over the WebSocket, for ever: on a
        disconnect, a `lagged` message or a node going away it reconnects
        (to the next URL, with backoff) with `since` = the last id seen, so
        nothing still retained is missed or repeated. A `gap` message (events
        after `since` already trimmed) is yielded as a Gap when `gaps` is
        true, else skipped. A refused subscription (400: bad topic or
        `since`) raises MusterError."""
        delay = self.backoff_base
        headers = {"authorization": f"Bearer {self.token}"} if self.token else None
        while True:
            url = self._ws_url(self.urls[self._current], topics, queue, since)
            try:
                with ws_client.connect(
                    url, additional_headers=headers, open_timeout=self.timeout, max_size=2**24
                ) as ws:
                    delay = self.backoff_base
                    for frame in ws:
                        msg = jsonlib.loads(frame)
                        kind = msg.get("type")
                        if kind == "gap":
                            if gaps:
                                yield Gap(oldest=str(msg.get("oldest")))
                            continue
                        if kind == "lagged":
                            since = str(msg.get("last_id") or since or "")
                            break
                        ev = Event.from_json(msg)
                        since = ev.id
                        yield ev
            except InvalidStatus as e:
                status = e.response.status_code
                if 400 <= status < 500:
                    try:
                        problem = jsonlib.loads(e.response.body or b"{}")
                    except ValueError:
                        problem = {"detail": (e.response.body or b"").decode(errors="replace")}
                    raise error_for(status, problem, "GET", url) from e
            except (OSError, ConnectionClosed, WebSocketException, asyncio.TimeoutError, TimeoutError):
                pass
            self._next_url()
            _compat.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.backoff_cap)

    def wait_for_result(self, task_id: str, timeout: float, *, recheck: float = 1.0) -> Task:
        """Waits until the task is finished (succeeded, dead or cancelled) and
        returns it; TimeoutError after `timeout` seconds. Subscribes to the
        terminal task events over the WebSocket first, then reads the task,
        and reads it again on each event and every `recheck` seconds, so
        neither a reconnect nor an event published just before the
        subscription makes it wait longer than that. Without the WebSocket
        it polls every `recheck` seconds."""
        deadline = time.monotonic() + timeout
        headers = {"authorization": f"Bearer {self.token}"} if self.token else None
        topics = "task.succeeded,task.dead,task.cancelled"
        ws: Any = None
        try:
            while True:
                if ws is None:
                    try:
                        ws = ws_client.connect(
                            self._ws_url(self.urls[self._current], topics, None, None),
                            additional_headers=headers,
                            open_timeout=min(self.timeout, max(0.1, deadline - time.monotonic())),
                        )
                    except (OSError, WebSocketException, asyncio.TimeoutError, TimeoutError):
                        ws = None
                task = self.get_task(task_id)
                if task.state in TERMINAL_STATES:
                    return task
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"task {task_id} is still {task.state} after {timeout} s")
                if ws is None:
                    _compat.sleep(min(recheck, left))
                    continue
                until = time.monotonic() + min(recheck, left)
                try:
                    while time.monotonic() < until:
                        frame = _compat.recv_within(ws, until - time.monotonic())
                        if frame is None or f'"{task_id}"' in str(frame):
                            break
                except (ConnectionClosed, WebSocketException, OSError):
                    ws = None
        finally:
            if ws is not None:
                ws.close()


__all__ = ["Client", "MusterError", "Unavailable"]
