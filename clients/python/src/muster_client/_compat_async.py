"""The few calls that differ between the asyncio and the blocking client
(`scripts/unasync.py` swaps this module for `_compat_sync`)."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def recv_within(ws: ClientConnection, seconds: float) -> str | bytes | None:
    """The next frame, or None when none came within `seconds`."""
    try:
        return await asyncio.wait_for(ws.recv(), seconds)
    except (asyncio.TimeoutError, TimeoutError):
        return None
