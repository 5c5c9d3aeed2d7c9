"""The FastAPI application: `create_app(settings)`; `attnsweep serve` runs it under uvicorn."""
from __future__ import annotations

import logging
from importlib import metadata

from fastapi import Depends, FastAPI

from api.deps import check_text_params
from api.errors import BodyLimit, SafeJSONResponse, install_error_handlers
from api import dashboard
from api.docs import install_docs
from api.routes import bisect, ci, failures, health, metrics, sweeps, webhooks, workers
from api.telemetry import Telemetry, TelemetryMiddleware
from settings import Settings, get_settings
from store.db import session_factory
from submit.ci import ci_spec
from workers.app import create_celery

log = logging.getLogger(__name__)

DESCRIPTION = """Queue sampled split-KV attention configs for GPU workers and query their results.

Writes (POST) need `Authorization: Bearer <token>` with a token of ATTNSWEEP_API_TOKENS when it
is set. Errors name the field and the rule: `{"detail": [{"field": ..., "rule": ...}]}`.
Non-finite metric values are written as the strings "nan", "inf" and "-inf".
"""


def _version() -> str:
    try:
        return metadata.version("attnsweep")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    ci_spec(settings)  # a deployment whose CI settings make no valid sweep request does not start
    app = FastAPI(title="attnsweep", version=_version(), description=DESCRIPTION, default_response_class=SafeJSONResponse,
                  dependencies=[Depends(check_text_params)], docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.sessions = session_factory(settings.database_url)
    app.state.celery = create_celery(settings)
    app.state.telemetry = Telemetry(app.state.sessions, settings.worker_stale_s, settings)
    if not settings.tokens:
        log.warning("ATTNSWEEP_API_TOKENS is unset: POST endpoints accept requests without a token")
    install_error_handlers(app)
    app.add_middleware(TelemetryMiddleware, telemetry=app.state.telemetry)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    for module in (sweeps, failures, workers, health, metrics, webhooks, ci, bisect, dashboard):
        app.include_router(module.router)
    _describe_openapi(app)
    install_docs(app)
    return app


def _describe_openapi(app: FastAPI) -> None:
    from api.schemas.descriptions import describe

    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = describe(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
