"""The service for real: PostgreSQL (a database per test), Redis, a `attnsweep worker` subprocess.

Each test gets queue names of its own (ATTNSWEEP_QUEUE_PREFIX) on the shared Redis, so test
runs on one machine never take each other's tasks; its keys are deleted afterwards. The API
runs in-process (FastAPI's TestClient) on the same settings.
"""
from __future__ import annotations

import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from harness import Proc, RedisServer, ServiceStack, service_env, wait_for

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("ATTNSWEEP_TEST_REDIS", "redis://127.0.0.1:6379/0")

__all__ = ["Proc", "REDIS_URL", "ROOT", "Service", "start_worker", "stop_worker", "wait_for"]


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
        return service_env(self.url, REDIS_URL, self.prefix, ATTNSWEEP_HEARTBEAT_S="1", **extra)


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


def start_worker(service: Service, tmp_path: Path, concurrency: int = 2, **env: str) -> Proc:
    """A `attnsweep worker --queue cpu` process on the test's database and queues, returned once
    it has registered in the workers table."""
    from store import repo
    from store.db import session_scope

    name = f"cpu-{uuid.uuid4().hex[:6]}@test"

    def registered(_worker: Proc) -> bool:
        with session_scope(service.url) as s:
            return any(w.name == name for w in repo.live_workers(s, 60.0))

    stack = ServiceStack(service.env(**env), tmp_path)
    worker = stack.start_worker(name, concurrency=concurrency, wait=False)
    try:
        stack.wait_ready(worker, registered, timeout=90)
    except BaseException:
        worker.stop()
        raise
    return worker


def stop_worker(worker: Proc) -> None:
    """Warm shutdown (SIGTERM), then SIGKILL to the worker's own process group if it lingers."""
    worker.stop()


@pytest.fixture
def worker(service: Service, tmp_path: Path) -> Iterator[Proc]:
    w = start_worker(service, tmp_path)
    try:
        yield w
    finally:
        stop_worker(w)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may freeze, thaw, kill and restart."""
    r = RedisServer(tmp_path / "redis")
    r.start()
    try:
        yield r
    finally:
        r.kill()
