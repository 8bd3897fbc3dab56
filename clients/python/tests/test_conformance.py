"""The conformance suite (tests/conformance/*.json at the repository root,
described in its README.md) run by the Python client: each scenario against
a fresh redis-server and two real nodes (conftest.Cluster), with this
package's Client and Worker."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ADMIN_TOKEN, WORKER_TOKEN, Cluster, wait_until

from muster_client import AsyncClient, ClaimedTask, Client, Conflict, Event, Worker

from conformance_handler import scripted_handler

DIR = Path(__file__).resolve().parents[3] / "tests" / "conformance"
WORKER_SCRIPT = Path(__file__).parent / "conformance_worker.py"
TERMINAL = {"succeeded", "dead", "cancelled"}

#: Scenarios this runner cannot run, and why (none).
SKIP: dict[str, str] = {}

SCENARIOS = sorted(DIR.glob("*.json"))


class Run:
    def __init__(self, cluster: Cluster, scenario: dict[str, Any], tmp: Path) -> None:
        self.cluster = cluster
        self.scenario = scenario
        self.tmp = tmp
        self.queue = f"conf-py-{scenario['name'].replace('_', '-')}-{os.getpid() % 10000}"
        self.client = Client(cluster.urls, ADMIN_TOKEN, retry_for=20.0)
        self.tasks: dict[str, str] = {}
        self.claims: dict[str, ClaimedTask] = {}
        self.workers: dict[str, dict[str, Any]] = {}
        self.follows: dict[str, list[Event]] = {}

    def worker_id(self, alias: str) -> str:
        return f"conf-py-{alias}-{os.getpid() % 10000}"

    def events(self, w: dict[str, Any]) -> list[dict[str, Any]]:
        if w["kind"] == "in":
            with w["lock"]:
                return list(w["events"])
        out: Path = w["out"]
        if not out.exists():
            return []
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]

    def step(self, s: dict[str, Any]) -> None:
        op = s["op"]
        within = s.get("within_ms", 15_000) / 1000
        c = self.client
        if op == "submit":
            r = c.submit(self.queue, s.get("payload"), max_attempts=s.get("max_attempts"),
                         timeout_ms=s.get("timeout_ms"), backoff_base_ms=s.get("backoff_base_ms"))
            assert r.state == "queued"
            self.tasks[s["as"]] = r.id
        elif op == "register":
            c.heartbeat_node(s["node"], ttl_ms=30_000)
        elif op == "claim":
            claimed = c.claim(self.queue, s["node"], max=1, wait_ms=2000)
            assert len(claimed) == 1, claimed
            assert claimed[0].id == self.tasks[s["task"]]
            assert claimed[0].token > 0
            self.claims[s["as"]] = claimed[0]
        elif op in ("complete", "fail"):
            cl = self.claims[s["claim"]]

            def call() -> None:
                if op == "complete":
                    c.complete(cl.id, cl.token, s.get("result"))
                else:
                    c.fail(cl.id, cl.token, "failed by the scenario", retry=s.get("retry", True))

            if s.get("expect") == "conflict":
                with pytest.raises(Conflict):
                    call()
            else:
                call()
        elif op == "cancel":
            c.cancel(self.tasks[s["task"]])
        elif op == "expect_task":
            self.expect_task(s)
        elif op == "wait_task":
            tid, state = self.tasks[s["task"]], s["state"]
            if state in TERMINAL:
                t = c.wait_for_result(tid, within)
                assert t.state == state, t
            else:
                wait_until(f"task {s['task']} {state}", lambda: c.get_task(tid).state == state, within)
        elif op == "stays":
            time.sleep(s.get("for_ms", 500) / 1000)
            assert c.get_task(self.tasks[s["task"]]).state == s["state"]
        elif op == "worker":
            events: list[dict[str, Any]] = []
            lock = threading.Lock()

            def note(e: dict[str, Any]) -> None:
                with lock:
                    events.append(e)

            wk = Worker(self.cluster.urls, self.queue, scripted_handler(note), token=WORKER_TOKEN,
                       worker_id=self.worker_id(s["as"]), concurrency=s.get("concurrency", 1),
                       ttl_ms=s.get("ttl_ms", 2000), heartbeat_every=s.get("heartbeat_ms", 300) / 1000,
                       grace=s.get("grace_ms", 5000) / 1000, poll_ms=500)
            th = threading.Thread(target=wk.run, kwargs={"handle_signals": False}, daemon=True)
            th.start()
            self.workers[s["as"]] = {"kind": "in", "worker": wk, "thread": th, "events": events, "lock": lock}
        elif op == "worker_process":
            wid = self.worker_id(s["as"])
            out = self.tmp / f"{wid}.jsonl"
            proc = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), ",".join(self.cluster.urls), WORKER_TOKEN, self.queue,
                 str(out), wid, str(s.get("ttl_ms", 1000)), str(s.get("grace_ms", 30_000))],
                stdout=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
            )
            self.workers[s["as"]] = {"kind": "proc", "proc": proc, "out": out}
        elif op == "wait_handler":
            w = self.workers[s["worker"]]
            tid = self.tasks[s["task"]]
            wait_until(
                f"{s['worker']}: {s['event']} of {s['task']} ({s.get('reason')})",
                lambda: any(
                    e.get("task") == tid and e.get("event") == s["event"]
                    and ("reason" not in s or e.get("reason") == s["reason"])
                    and ("attempt" not in s or e.get("attempt") == s["attempt"])
                    for e in self.events(w)
                ),
                within,
            )
        elif op == "signal_worker":
            w = self.workers[s["worker"]]
            w["proc"].send_signal(signal.SIGKILL if s["signal"] == "KILL" else signal.SIGTERM)
        elif op == "wait_exit":
            assert self.workers[s["worker"]]["proc"].wait(timeout=within) == 0
        elif op == "stop_worker":
            w = self.workers[s["worker"]]
            w["worker"].stop()
            w["thread"].join(timeout=15)
            assert not w["thread"].is_alive(), "the worker did not stop"
        elif op == "expect_worker_stats":
            stats = self.workers[s["worker"]]["worker"].stats
            for k, v in s["at_least"].items():
                assert getattr(stats, k) >= v, f"stats.{k} = {getattr(stats, k)} < {v}"
        elif op == "kill_node":
            self.cluster.nodes[s["node"]].kill()
        elif op == "follow":
            since = s.get("since")
            if since == "start":
                since = "0"
            elif since:
                since = self.follows[since][-1].id
            got: list[Event] = []
            box: list[BaseException] = []

            async def collect() -> None:
                async with AsyncClient(self.cluster.urls, ADMIN_TOKEN) as ac:
                    async for ev in ac.follow(topics=s["topics"], queue=self.queue, since=since):
                        assert isinstance(ev, Event)
                        got.append(ev)
                        if len(got) >= s["count"]:
                            return

            try:
                asyncio.run(asyncio.wait_for(collect(), within))
            except BaseException as e:  # noqa: BLE001 - reported below
                box.append(e)
            assert [e.task for e in got] == [self.tasks[a] for a in s["expect_tasks"]], (got, box)
            self.follows[s["as"]] = got
        else:
            raise AssertionError(f"unknown op {op}")

    def expect_task(self, s: dict[str, Any]) -> None:
        t = self.client.get_task(self.tasks[s["task"]])
        what = f"task {s['task']}: {t}"
        if "state" in s:
            assert t.state == s["state"], what
        if "payload" in s:
            assert t.payload == s["payload"], what
        if "owner" in s:
            assert t.owner == s["owner"], what
        if "attempts" in s:
            assert t.attempts == s["attempts"], what
        if "succeeded_attempts" in s:
            assert sum(1 for a in t.attempt_log if a.outcome == "succeeded") == s["succeeded_attempts"], what
        if "result" in s:
            want = s["result"]
            if isinstance(want, dict) and isinstance(t.result, dict):
                for k, v in want.items():
                    assert t.result.get(k) == v, what
            else:
                assert t.result == want, what
        if "result_by" in s:
            assert isinstance(t.result, dict) and t.result.get("by") == self.worker_id(s["result_by"]), what

    def close(self) -> None:
        for w in self.workers.values():
            if w["kind"] == "in":
                w["worker"].stop()
                w["thread"].join(timeout=10)
            elif w["proc"].poll() is None:
                w["proc"].kill()
                w["proc"].wait()
        self.client.close()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_conformance(path: Path) -> None:
    scenario = json.loads(path.read_text())
    if scenario["name"] in SKIP:
        pytest.skip(SKIP[scenario["name"]])
    binary = os.environ.get("MUSTER_BIN")
    if not binary:
        pytest.skip("MUSTER_BIN is not set (the path of the muster binary)")
    if not shutil.which(os.environ.get("MUSTER_TEST_REDIS_BIN", "redis-server")):
        pytest.skip("redis-server is not installed")
    root = Path(tempfile.mkdtemp(prefix="muster-pyconf-"))
    cluster = Cluster(binary, root)
    run = Run(cluster, scenario, root)
    try:
        for i, s in enumerate(scenario["steps"], 1):
            try:
                run.step(s)
            except AssertionError as e:
                raise AssertionError(f"step {i} {json.dumps(s)}: {e}") from e
    finally:
        run.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
