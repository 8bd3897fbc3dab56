"""A worker process for the conformance suite (tests/conformance/README.md):
the scripted handler under a Worker of its own (SIGTERM handled by the
Worker). Each handler event is appended to OUT as a JSON line, then
{"event": "exit", ...}.

Usage: conformance_worker.py URLS TOKEN QUEUE OUT ID TTL_MS GRACE_MS"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from muster_client import Worker

from conformance_handler import scripted_handler


def main() -> None:
    urls, token, queue, out, wid, ttl, grace = sys.argv[1:8]
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    lock = threading.Lock()

    def note(e: dict[str, Any]) -> None:
        with lock, Path(out).open("a") as f:
            f.write(json.dumps(e) + "\n")

    w = Worker(urls.split(","), queue, scripted_handler(note), token=token, worker_id=wid,
               ttl_ms=int(ttl), grace=int(grace) / 1000, poll_ms=1000, heartbeat_every=0.3)
    w.run()
    s = w.stats
    note({"event": "exit", "stats": {"completed": s.completed, "handed_back": s.handed_back}})


if __name__ == "__main__":
    main()
