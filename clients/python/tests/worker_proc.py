"""A worker process for the kill and SIGTERM tests: each handler sleeps
`--work` seconds and returns who ran it. Every start and finish is appended
to OUT as a line (`start <task>` / `end <task>`), then `exit <stats>`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from muster_client import ClaimedTask, TaskContext, Worker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("urls")
    ap.add_argument("token")
    ap.add_argument("queue")
    ap.add_argument("out")
    ap.add_argument("--id", required=True)
    ap.add_argument("--work", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--ttl-ms", type=int, default=1000)
    a = ap.parse_args()
    out = Path(a.out)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    def note(line: str) -> None:
        with out.open("a") as f:
            f.write(line + "\n")

    def handler(task: ClaimedTask, ctx: TaskContext) -> dict[str, object]:
        note(f"start {task.id}")
        ctx.cancelled.wait(a.work)
        note(f"end {task.id} {ctx.reason}")
        return {"by": a.id}

    w = Worker(
        a.urls.split(","),
        a.queue,
        handler,
        token=a.token,
        worker_id=a.id,
        concurrency=a.concurrency,
        grace=a.grace,
        ttl_ms=a.ttl_ms,
        poll_ms=1000,
        heartbeat_every=0.3,
    )
    w.run()
    s = w.stats
    note("exit " + json.dumps({"completed": s.completed, "claimed": s.claimed, "handed_back": s.handed_back}))
    time.sleep(0)


if __name__ == "__main__":
    main()
