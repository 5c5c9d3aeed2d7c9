"""Dependencies as Annotated aliases: the settings, a database session, the Celery app (access: api/auth.py)."""
from __future__ import annotations

from typing import Annotated, AsyncIterator

from anyio import CancelScope, CapacityLimiter, to_thread
from celery import Celery
from fastapi import Depends, HTTPException, Path, Query, Request, status
from store.db import Session

from api.errors import ProblemError
from attnconfig.config import INT4_MAX, INT8_MAX, text_problem
from settings import Settings
from store.models import Sweep

# Ids are int4 columns; offsets go to SQL OFFSET, which takes an int8.
SweepId = Annotated[int, Path(ge=1, le=INT4_MAX, description="the sweep's id")]
Offset = Annotated[int, Query(ge=0, le=INT8_MAX, description="rows to skip")]
# Longest query or path value: longer ones can match nothing the store holds (labels are 200
# characters, refs 255) and would only cost the database a comparison.
MAX_PARAM_CHARS = 1000


# The dependencies that only read the request or the app's state are coroutines: FastAPI runs a
# plain function dependency in its thread pool, a hop per dependency per request.
async def check_text_params(request: Request) -> None:
    """Every query and path value is storable text (no NUL, no lone surrogate) of at most
    MAX_PARAM_CHARS characters: else 422 naming the parameter, before any handler runs."""
    problems = []
    for name, value in [*request.query_params.multi_items(), *request.path_params.items()]:
        if not isinstance(value, str):
            continue
        problem = text_problem(value) or text_problem(name)
        if problem is None and len(value) > MAX_PARAM_CHARS:
            problem = f"at most {MAX_PARAM_CHARS} characters (got {len(value)})"
        if problem is not None:
            shown = name if text_problem(name) is None else ascii(name)
            problems.append((shown, f"{shown}: {problem}"))
    if problems:
        raise ProblemError(problems)


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for the request. Made here without a thread (a new session does no I/O; the
    route's thread connects on its first query) and closed in one, since closing rolls back
    and returns its connection: one thread-pool hop per request instead of two. The close
    runs as FastAPI runs a dependency's exit: shielded from the request's cancellation (its
    connection goes back to the pool however the request ended) and outside the thread pool's
    capacity, which requests waiting for a pooled connection may all hold."""
    session = request.app.state.sessions()
    try:
        yield session
    finally:
        with CancelScope(shield=True):
            await to_thread.run_sync(session.close, limiter=CapacityLimiter(1))


SessionDep = Annotated[Session, Depends(get_session)]


def sweep_or_404(session: Session, sweep_id: int) -> Sweep:
    """The sweep with this id, or an HTTP 404 that names it."""
    sweep = session.get(Sweep, sweep_id) if 1 <= sweep_id <= INT4_MAX else None
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"sweep {sweep_id} not found")
    return sweep


async def get_celery(request: Request) -> Celery:
    return request.app.state.celery


CeleryDep = Annotated[Celery, Depends(get_celery)]


async def get_telemetry(request: Request):  # noqa: ANN201
    return request.app.state.telemetry


TelemetryDep = Annotated[object, Depends(get_telemetry)]
