"""The service for real: PostgreSQL (a database per test), Redis, a `attnsweep worker` subprocess.

Each test gets queue names of its own (ATTNSWEEP_QUEUE_PREFIX) on the shared Redis, so test
runs on one machine never take each other's tasks; its keys are deleted afterwards. The API
runs in-process (FastAPI's TestClient) on the same settings.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("ATTNSWEEP_TEST_REDIS", "redis://127.0.0.1:6379/0")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Service:
    url: str
    prefix: str
    settings: Any

    def client(self, headers: dict[str, str] | None = None, **overrides: Any):  # noqa: ANN201
        """A client of an API on these settings with `overrides`, sending the tests' admin token
        unless `headers` says otherwise."""
        from settings import Settings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fastapi.testclient import TestClient
        from api.main import create_app

        from tests.conftest import AUTH

        settings = Settings(**{**self.settings.model_dump(), **overrides})
        return TestClient(create_app(settings), headers=AUTH if headers is None else headers)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSWEEP_")}
        env.update(ATTNSWEEP_DATABASE_URL=self.url, ATTNSWEEP_BROKER_URL=REDIS_URL, ATTNSWEEP_QUEUE_PREFIX=self.prefix,
                   ATTNSWEEP_HEARTBEAT_S="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        env.update(extra)
        return env


def _purge(prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [k for pattern in (f"{prefix}*", f"_kombu.binding.{prefix}*") for k in r.scan_iter(pattern)]
        if keys:
            r.delete(*keys)
    finally:
        r.close()


@pytest.fixture
def service(pg_url) -> Iterator[Service]:  # noqa: ANN001
    from settings import Settings
    from store.migrate import upgrade

    upgrade(pg_url)
    prefix = f"it{uuid.uuid4().hex[:10]}-"
    from tests.conftest import TEST_TOKENS

    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, queue_prefix=prefix, api_tokens=TEST_TOKENS)
    try:
        yield Service(pg_url, prefix, settings)
    finally:
        _purge(prefix)


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_worker(service: Service, tmp_path: Path, concurrency: int = 2, **env: str) -> Worker:
    from store import repo
    from store.db import session_scope

    name = f"cpu-{uuid.uuid4().hex[:6]}@test"
    log = tmp_path / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "worker", "--queue", "cpu", "--concurrency", str(concurrency), "--name", name],
            cwd=ROOT, env=service.env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    worker = Worker(name, proc, log)

    def registered() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}:\n{worker.tail()}")
        with session_scope(service.url) as s:
            return any(w.name == name for w in repo.live_workers(s, 60.0))

    try:
        wait_for(registered, 90, "the worker to register")
    except BaseException:
        stop_worker(worker)
        raise
    return worker


def stop_worker(worker: Worker) -> None:
    """Warm shutdown (SIGTERM), then SIGKILL to the worker's own process group if it lingers."""
    if worker.proc.poll() is not None:
        return
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=10)


@pytest.fixture
def worker(service: Service, tmp_path: Path) -> Iterator[Worker]:
    w = start_worker(service, tmp_path)
    try:
        yield w
    finally:
        stop_worker(w)


@dataclass
class PrivateRedis:
    """A redis-server of the test's own on a free loopback port (AOF on, as in docker-compose),
    which the test may freeze (SIGSTOP), thaw, kill and restart without touching the shared one."""

    port: int
    dir: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--appendonly", "yes",
             "--save", "", "--protected-mode", "yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        def up() -> bool:
            try:
                return bool(redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).ping())
            except redis.RedisError:
                return False

        wait_for(up, 20, f"redis-server on port {self.port}")

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(free_port(), tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.kill()
