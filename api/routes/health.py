"""Liveness of the API's dependencies: the database (at the newest schema, and able to write:
a database whose disk is full still answers reads) and the broker.

/healthz answers within HEALTH_DEADLINE_S whatever its dependencies do: both are checked at
once, each in a thread of its own, and one that has not answered by the deadline is reported
as not answering (a frozen Redis accepts connections and answers nothing; a server that drops
packets answers neither). A check still running past the deadline ends by its own socket
timeouts; it is never waited for.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from fastapi import APIRouter, Request, Response, status
from sqlalchemy import text

from api.schemas.health import Health
from store.db import check_writable
from store.migrate import is_current
from workers.app import redis_client

router = APIRouter(tags=["health"])

HEALTH_DEADLINE_S = 1.5  # both checks together; the answer goes out well within 2 s


def _database(request: Request) -> str:
    settings = request.app.state.settings
    with request.app.state.sessions() as session:
        session.execute(text("SELECT 1"))
        try:
            check_writable(session)
        except Exception as exc:  # noqa: BLE001 - answers, cannot write: reported as such
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"error: answers but cannot write: {first}"[:300]
    if not is_current(settings.database_url):
        return "schema is behind: run `attnsweep db upgrade`"
    return "ok"


def _broker(request: Request) -> str:
    settings = request.app.state.settings
    client = redis_client(settings, timeout=HEALTH_DEADLINE_S)
    if client is None:  # not Redis (memory:// in tests): kombu's own check
        with request.app.state.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=HEALTH_DEADLINE_S)
        return "ok"
    try:
        client.ping()
    finally:
        client.close()
    return "ok"


def _checked(checks: dict[str, Callable[[], str]], deadline_s: float) -> dict[str, str]:
    """Run every check in a daemon thread; whatever has not answered by the deadline is down."""
    results: dict[str, str] = {}

    def run(name: str, check: Callable[[], str]) -> None:
        try:
            results[name] = check()
        except Exception as exc:  # noqa: BLE001 - reported, not raised: this is the health check
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            results[name] = f"error: {type(exc).__name__}: {first}"[:300]

    threads = [threading.Thread(target=run, args=item, daemon=True, name=f"healthz-{item[0]}") for item in checks.items()]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return {name: results.get(name, f"error: no answer within {deadline_s:g} s") for name in checks}


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def read_health(request: Request, response: Response) -> Health:
    """200 when the database answers and can write and the broker answers, else 503 naming what
    failed; always within 2 s."""
    found = _checked({"database": lambda: _database(request), "broker": lambda: _broker(request)}, HEALTH_DEADLINE_S)
    ok = all(v == "ok" for v in found.values())
    if not ok:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return Health(status="ok" if ok else "unavailable", **found)
