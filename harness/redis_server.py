"""A redis-server of its own on a free loopback port, with AOF on as in docker-compose, which a
test or drill may freeze (SIGSTOP), thaw, kill, flush and restart without touching any other."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from harness.net import free_port, wait_for


class RedisServer:
    def __init__(self, folder: Path, port: int | None = None):
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):  # noqa: ANN201 - redis.Redis, imported late
        import redis

        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def _ping(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        finally:
            client.close()

    def start(self, timeout: float = 30) -> None:
        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--save", "", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._ping, timeout, f"redis-server on port {self.port}", ignore=(redis.RedisError,))

    @property
    def pid(self) -> int:
        assert self.proc is not None, "redis-server was never started"
        return self.proc.pid

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def flushall(self) -> None:
        """Everything the broker holds is lost at once (queues, unacknowledged deliveries, locks)."""
        client = self.client()
        try:
            client.flushall()
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)
