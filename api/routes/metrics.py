"""Prometheus exposition of the API's metrics (api.telemetry)."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def read_metrics(request: Request) -> Response:
    """Request counts and latencies, sweeps by status, queued configs, live workers per queue."""
    return Response(generate_latest(request.app.state.telemetry.registry), media_type=CONTENT_TYPE_LATEST)
