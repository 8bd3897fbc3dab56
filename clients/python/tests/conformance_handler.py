"""The conformance suite's handler (tests/conformance/README.md#the-handler):
its behaviour comes from the task's payload; every start and abort is
reported to `note`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from muster_client import ClaimedTask, Fail, TaskContext


def scripted_handler(note: Callable[[dict[str, Any]], None]) -> Callable[[ClaimedTask, TaskContext], Any]:
    def handler(task: ClaimedTask, ctx: TaskContext) -> dict[str, Any]:
        p = task.payload if isinstance(task.payload, dict) else {}
        note({"event": "start", "task": task.id, "attempt": task.attempt})
        fail_until = p.get("fail_until")
        if isinstance(fail_until, int) and task.attempt < fail_until:
            raise Fail(f"planned failure on attempt {task.attempt}")
        on = p.get("block_attempts")
        if p.get("block") is True and (not isinstance(on, list) or task.attempt in on):
            ctx.cancelled.wait(p.get("block_ms", 30_000) / 1000)
            if ctx.is_cancelled:
                note({"event": "aborted", "task": task.id, "attempt": task.attempt, "reason": ctx.reason})
        if isinstance(p.get("sleep_ms"), int):
            ctx.cancelled.wait(p["sleep_ms"] / 1000)
        if ctx.reason == "cancel_requested" and p.get("on_cancel") != "return":
            raise RuntimeError("stopped on a cancel request")
        return {"echo": p.get("echo"), "attempt": task.attempt, "by": ctx.worker_id}

    return handler
