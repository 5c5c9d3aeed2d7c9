"""Liveness of the API's dependencies: the database (at the newest schema) and the broker."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from sqlalchemy import text

from api.schemas.health import Health
from store.migrate import is_current

router = APIRouter(tags=["health"])


def _database(request: Request) -> str:
    settings = request.app.state.settings
    try:
        with request.app.state.sessions() as session:
            session.execute(text("SELECT 1"))
        if not is_current(settings.database_url):
            return "schema is behind: run `attnsweep db upgrade`"
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised: this is the health check
        return f"error: {type(exc).__name__}: {exc}"


def _broker(request: Request) -> str:
    try:
        with request.app.state.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return f"error: {type(exc).__name__}: {exc}"


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def read_health(request: Request, response: Response) -> Health:
    """200 when the database and the broker answer, else 503 with what failed."""
    database, broker = _database(request), _broker(request)
    ok = database == "ok" and broker == "ok"
    if not ok:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return Health(status="ok" if ok else "unavailable", database=database, broker=broker)
