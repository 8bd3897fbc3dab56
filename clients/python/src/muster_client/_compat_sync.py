"""The few calls that differ between the asyncio and the blocking client."""

from __future__ import annotations

import time

from websockets.sync.client import ClientConnection


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def recv_within(ws: ClientConnection, seconds: float) -> str | bytes | None:
    """The next frame, or None when none came within `seconds`."""
    try:
        return ws.recv(timeout=seconds)
    except TimeoutError:
        return None
