"""The FastAPI application: `create_app(settings)`; `attnsweep serve` runs it under uvicorn."""
from __future__ import annotations

import logging
from importlib import metadata

from fastapi import Depends, FastAPI

from api.auth import read_access
from api.deps import check_text_params
from api.errors import BodyLimit, SafeJSONResponse, install_error_handlers
from api.security import SecurityHeaders
from api import dashboard
from api.docs import install_docs
from api.routes import bisect, ci, compare, failures, health, metrics, sweeps, webhooks, workers
from api.telemetry import Telemetry, TelemetryMiddleware
from settings import Settings, get_settings
from settings.secrets import install_log_scrubbing
from store.db import session_factory
from submit.ci import ci_spec
from workers.app import create_celery

log = logging.getLogger(__name__)

DESCRIPTION = """Queue sampled split-KV attention configs for GPU workers and query their results.

Writes (POST) need `Authorization: Bearer <secret>` with a token of ATTNSWEEP_API_TOKENS of scope
`submit` (or `admin`), and a JSON body (`Content-Type: application/json`); reads need a token of
scope `read` where ATTNSWEEP_READ_AUTH is on. Errors name the field and the rule:
`{"detail": [{"field": ..., "rule": ...}]}`. Non-finite metric values are written as the strings
"nan", "inf" and "-inf".
"""


def _version() -> str:
    try:
        return metadata.version("attnsweep")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    ci_spec(settings)  # a deployment whose CI settings make no valid sweep request does not start
    install_log_scrubbing(settings.scrub)
    app = FastAPI(title="attnsweep", version=_version(), description=DESCRIPTION, default_response_class=SafeJSONResponse,
                  dependencies=[Depends(check_text_params), Depends(read_access)], docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.sessions = session_factory(settings.database_url)
    app.state.celery = create_celery(settings)
    app.state.telemetry = Telemetry(app.state.sessions, settings.worker_stale_s, settings)
    _say_who_may(settings)
    install_error_handlers(app)
    app.add_middleware(TelemetryMiddleware, telemetry=app.state.telemetry)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SecurityHeaders)
    for module in (sweeps, failures, workers, health, metrics, webhooks, ci, bisect, compare, dashboard):
        app.include_router(module.router)
    _describe_openapi(app, settings)
    install_docs(app)
    return app


def _say_who_may(settings: Settings) -> None:
    if settings.auth == "off":
        log.warning("#" * 78)
        log.warning("# ATTNSWEEP_AUTH=off: anyone who reaches this API may submit, cancel and read. #")
        log.warning("#" * 78)
        return
    if not settings.tokens:
        log.warning("ATTNSWEEP_API_TOKENS is empty: every write is refused until a token of scope submit is set")
    scopes = ", ".join(f"{t.name} ({t.scope})" for t in settings.tokens)
    log.info("API tokens: %s; reads %s", scopes or "none", "need scope read" if settings.read_auth else "are open")


def _describe_openapi(app: FastAPI, settings: Settings) -> None:
    from api.openapi_errors import document_errors
    from api.schemas.descriptions import describe

    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(describe(build()), settings.auth == "on" and settings.read_auth)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
