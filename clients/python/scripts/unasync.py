"""Writes src/muster_client/_sync_client.py from _async_client.py.

The blocking client is the asyncio one with async/await removed and the
asyncio libraries swapped for their blocking twins (the approach of
httpcore's unasync). `--check` exits 1 when the file on disk differs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "src" / "muster_client"

# Order matters: longer patterns first.
SUBS = [
    (r'"""The asyncio client:', '"""The blocking client (generated from _async_client.py: do not edit):'),
    (r"\bfrom \. import _compat_async as _compat\b", "from . import _compat_sync as _compat"),
    (r"\bwebsockets\.asyncio\.client\b", "websockets.sync.client"),
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncClient\b", "Client"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\baclose\b", "close"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
]


def generate() -> str:
    text = (PKG / "_async_client.py").read_text()
    for pattern, repl in SUBS:
        text = re.sub(pattern, repl, text)
    return text


def main() -> int:
    out = PKG / "_sync_client.py"
    text = generate()
    if "--check" in sys.argv:
        if out.read_text() != text:
            print(f"{out} is out of date: run python scripts/unasync.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
