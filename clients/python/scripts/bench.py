"""What the Python Worker costs: drains N tasks with one AsyncWorker and
prints tasks/s for a few shapes (async handler, one at a time and batched;
a blocking handler in threads). Starts its own redis-server and one node
(MUSTER_BIN), as the tests do.

    MUSTER_BIN=target/release/muster python clients/python/scripts/bench.py 2000
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import ADMIN_TOKEN, WORKER_TOKEN, Cluster  # noqa: E402

from muster_client import AsyncWorker, ClaimedTask, Client, TaskContext  # noqa: E402


async def drain(urls: list[str], queue: str, n: int, concurrency: int, batch: int, blocking: bool) -> float:
    async def ahandler(task: ClaimedTask, ctx: TaskContext) -> Any:
        return task.payload

    def bhandler(task: ClaimedTask, ctx: TaskContext) -> Any:
        return task.payload

    w = AsyncWorker(urls, queue, bhandler if blocking else ahandler, token=WORKER_TOKEN,
                    concurrency=concurrency, batch=batch, poll_ms=200)
    run = asyncio.ensure_future(w.run(handle_signals=False))
    started = time.monotonic()
    while w.stats.completed < n:
        await asyncio.sleep(0.01)
    took = time.monotonic() - started
    w.stop()
    await run
    return n / took


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    assert os.environ.get("MUSTER_BIN"), "set MUSTER_BIN"
    cluster = Cluster(os.environ["MUSTER_BIN"], Path(tempfile.mkdtemp(prefix="muster-pybench-")))
    try:
        urls = cluster.urls[:1]
        for name, conc, batch, blocking in [
            ("async handler, concurrency 1, batch 1", 1, 1, False),
            ("async handler, concurrency 16, batch 16", 16, 16, False),
            ("blocking handler, concurrency 16, batch 16", 16, 16, True),
        ]:
            queue = f"bench-{conc}-{batch}-{int(blocking)}"
            with Client(urls, ADMIN_TOKEN) as c:
                for s in range(0, n, 1000):
                    c.submit_batch(queue, [{"payload": i} for i in range(s, min(n, s + 1000))])
            rate = asyncio.run(drain(urls, queue, n, conc, batch, blocking))
            print(f"{name}: {rate:.0f} tasks/s ({n} tasks)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
