"""Fixtures: a real redis-server on a free port and two real muster nodes
(the binary from MUSTER_BIN), each configured with a written config.toml.
No mocks. Without MUSTER_BIN or redis-server the tests are skipped (the
Rust test tests/it/client_python.rs always sets MUSTER_BIN)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

WORKER_TOKEN = "py-client-w"
ADMIN_TOKEN = "py-client-a"
#: Node timings: a killed node is dead within a second; orphans are looked
#: for every 200 ms.
NODE_HEARTBEAT_MS = 200
NODE_TTL_MS = 1000
CLEANER_MS = 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, cond: Callable[[], Any], timeout: float = 15.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class Redis:
    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.dir = root / "redis"
        self.dir.mkdir()
        binary = os.environ.get("MUSTER_TEST_REDIS_BIN", "redis-server")
        self.log = self.dir / "redis.log"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--logfile", str(self.log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until("redis PING", self._ping, timeout=10)

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Node:
    """One muster process; kill() is SIGKILL, start() brings it back on the same port."""

    def __init__(self, binary: str, root: Path, index: int, redis_url: str, extra: str = "") -> None:
        self.binary = binary
        self.id = f"py-node-{index}"
        self.port = free_port()
        self.dir = root / self.id
        self.dir.mkdir()
        self.log = self.dir / "node.log"
        self.config = self.dir / "config.toml"

        def sha(t: str) -> str:
            return hashlib.sha256(t.encode()).hexdigest()

        self.config.write_text(
            f"""[server]
listen = "127.0.0.1:{self.port}"
node_id = "{self.id}"
data_dir = "{self.dir / 'data'}"

[redis]
url = "{redis_url}"

[nodes]
heartbeat_ms = {NODE_HEARTBEAT_MS}
ttl_ms = {NODE_TTL_MS}
dead_retention_ms = 5000

[orphans]
interval_ms = {CLEANER_MS}

[[auth.tokens]]
name = "w"
role = "worker"
sha256 = "{sha(WORKER_TOKEN)}"

[[auth.tokens]]
name = "a"
role = "admin"
sha256 = "{sha(ADMIN_TOKEN)}"
{extra}"""
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        env["RUST_LOG"] = "warn"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--config", str(self.config)], cwd=self.dir, env=env, stdout=log, stderr=log
            )
        wait_until(f"{self.id} ready", self._ready, timeout=20)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.id} exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None


class Cluster:
    def __init__(self, binary: str, root: Path) -> None:
        self.root = root
        self.redis = Redis(root)
        self.nodes = [Node(binary, root, i, self.redis.url) for i in range(2)]
        for n in self.nodes:
            n.start()

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
        self.redis.stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    binary = os.environ.get("MUSTER_BIN")
    if not binary:
        pytest.skip("MUSTER_BIN is not set (the path of the muster binary)")
    if not shutil.which(os.environ.get("MUSTER_TEST_REDIS_BIN", "redis-server")):
        pytest.skip("redis-server is not installed")
    root = Path(tempfile.mkdtemp(prefix="muster-pyclient-"))
    c = Cluster(binary, root)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name of its own for each test."""
    return f"py-{request.node.name.replace('[', '-').replace(']', '')[:60]}-{os.getpid() % 1000}"


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A URL nothing answers, for the whole test: its port stays bound (not
    listening, so a connection is refused), so no node or Redis started by a
    test running beside this one can take it (a port only found free could be,
    and then answered: seen once in CI)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


WORKER_SCRIPT = Path(__file__).parent / "worker_proc.py"


def spawn_worker(urls: list[str], queue: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    """Runs tests/worker_proc.py as its own process (to be killed or SIGTERMed)."""
    return subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), ",".join(urls), WORKER_TOKEN, queue, str(out), *args],
        stdout=subprocess.DEVNULL,
        stderr=open(str(out) + ".err", "wb"),
    )
