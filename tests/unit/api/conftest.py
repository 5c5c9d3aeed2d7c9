"""An API on a fresh SQLite file with kombu's in-memory broker: no server, no Redis."""
from __future__ import annotations

import uuid
import warnings
from typing import Any, Iterator

import pytest

BASE = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=1, head_dim_qk=32, head_dim_v=32)


def make_settings(url: str, **overrides: Any):
    from settings import Settings

    from tests.conftest import TEST_TOKENS

    fields = dict(database_url=url, broker_url="memory://", queue_prefix=f"u{uuid.uuid4().hex[:8]}-",
                  api_tokens=TEST_TOKENS)
    fields.update(overrides)
    return Settings(**fields)


def make_client(settings, headers: dict[str, str] | None = None):  # noqa: ANN001, ANN201
    """A client of the API on `settings`, sending the tests' admin token unless `headers` says otherwise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from api.main import create_app
    from tests.conftest import AUTH

    return TestClient(create_app(settings), headers=AUTH if headers is None else headers)


@pytest.fixture
def settings(sqlite_url):  # noqa: ANN001, ANN201
    from store.migrate import upgrade

    upgrade(sqlite_url)
    return make_settings(sqlite_url)


@pytest.fixture
def client(settings) -> Iterator[Any]:  # noqa: ANN001
    with make_client(settings) as c:
        yield c


def published(settings, queue_kind: str = "cpu") -> list[dict]:  # noqa: ANN001
    """Every task message waiting in a queue of the in-memory broker (consumed by reading)."""
    from workers.app import create_celery

    celery = create_celery(settings)
    out = []
    with celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(settings.queue_name(queue_kind), no_ack=True)
        while True:
            try:
                msg = queue.get(block=False)
            except queue.Empty:
                break
            out.append({"headers": msg.headers, "args": msg.payload[0]})
        queue.close()
    return out


def run_queued(settings, queue_kind: str = "cpu", hold: tuple[str, ...] = ()) -> tuple[list[str], list[dict]]:  # noqa: ANN001
    """Run every task waiting in a queue of the in-memory broker in this process, as a worker's
    task would (workers/tasks.py: its app publishes what the task publishes), until the queue is
    empty. Tasks named in `hold` are taken off the queue without running. Returns the names of
    the tasks run, in order, and the tasks held."""
    from workers.app import TASK_BISECT, TASK_RUN_CONFIGS, TASK_TRIAGE, create_celery
    from workers.bisect import run_bisection
    from workers.execute import execute_batch
    from tests.unit.triage.sweeps import triage_at

    celery = create_celery(settings)
    url = settings.database_url
    ran: list[str] = []
    held: list[dict] = []
    while True:
        tasks = published(settings, queue_kind)
        if not tasks:
            return ran, held
        for task in tasks:
            name, args = task["headers"]["task"], task["args"]
            if name in hold:
                held.append(task)
                continue
            if name == TASK_RUN_CONFIGS:
                sweep_id, items, backend, defects, err_ratio_gate = args
                execute_batch(settings, sweep_id, items, backend, defects, err_ratio_gate, worker="inline", celery=celery)
            elif name == TASK_TRIAGE:
                triage_at(url, args[0], settings, celery=celery)
            elif name == TASK_BISECT:
                run_bisection(url, args[0], settings)
            else:
                raise AssertionError(f"unknown task {name}")
            ran.append(name)
