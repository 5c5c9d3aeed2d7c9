"""POST /webhooks/ci: GitHub-style push and pull_request events start a sweep of the commit.

The delivery is authenticated by its HMAC signature (X-Hub-Signature-256 under
ATTNSWEEP_WEBHOOK_SECRET), not by a bearer token: a code host cannot send one. The signature is
checked over the raw body before anything is parsed, and a delivery that fails it stores nothing. A pull request from a fork is built only when the
deployment trusts the fork's repository (ATTNSWEEP_KERNEL_REPOSITORIES); otherwise its commit
status says it was not swept.
"""
from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request, Response, status
from store.db import Session
from starlette.concurrency import run_in_threadpool

from api.auth import UnsignedWrite
from api.deps import CeleryDep, SessionDep, SettingsDep
from api.errors import ProblemError
from api.schemas.ci import CiWebhookReply
from api.schemas.common import Message, Problems
from attnconfig.config import text_problem
from ci.events import CiEvent, EventError, Ignored, parse_event
from ci.notify import deployment_repository, post_not_swept, post_status
from ci.signature import HEADER, signature_problem
from settings import Settings
from kernelsrc.git import KernelRepoError
from kernelsrc.manifest import ManifestError
from kernelsrc.trust import is_trusted
from submit.ci import CiSpecError, start_ci_sweep
from submit.sweep import SubmitError

router = APIRouter(tags=["ci"])

EVENT_HEADER = "X-GitHub-Event"
DELIVERY_HEADER = "X-GitHub-Delivery"
SHA_FIELD = {"push": "after", "pull_request": "pull_request.head.sha"}


def _payload(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProblemError([("body", f"not valid JSON: {exc}")]) from None


def _trusted(settings: Settings, event: CiEvent) -> CiEvent | Ignored:
    """The event, or why its code is not built: another repository than this deployment's, or a
    pull request from a fork whose repository the deployment does not trust (its status says so)."""
    own = deployment_repository(settings)
    if own is not None and event.repository.lower() != own.lower():
        return Ignored(f"repository {event.repository} is not this deployment's ({own})")
    if event.fork is not None and not any(is_trusted(url, settings) for url in event.fork_urls):
        reason = "not swept: head repository not trusted"
        post_not_swept(settings, event.repository, event.commit_sha, reason)
        return Ignored(f"{reason} ({event.fork}; a fork's code is built only when ATTNSWEEP_KERNEL_REPOSITORIES "
                       "lists its clone URL)")
    return event


def _start(session: Session, celery: Any, settings: Settings, event: CiEvent, delivery: str, body_sha256: str) -> CiWebhookReply:
    try:
        started = start_ci_sweep(session, celery, settings, event, delivery, body_sha256)
    except KernelRepoError as exc:
        session.rollback()
        if exc.missing:
            raise ProblemError([(SHA_FIELD[event.event], str(exc))]) from None
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"reading the kernel repository failed: {exc}") from None
    except ManifestError as exc:
        # The commit's own mistake: its status says so, as the answer does.
        session.rollback()
        post_not_swept(settings, event.repository, event.commit_sha, f"not swept: {exc}")
        raise ProblemError([(SHA_FIELD[event.event], str(exc))]) from None
    except CiSpecError as exc:
        session.rollback()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    except SubmitError as exc:
        session.rollback()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"ATTNSWEEP_CI_SPEC samples too few configs: {exc}") from None
    if not started.replayed:
        post_status(settings, session, started.sweep_id)  # pending, with the config count
    return CiWebhookReply(
        status="replayed" if started.replayed else "started", event=event.event, sweep_id=started.sweep_id,
        commit_sha=event.commit_sha, ref=event.ref, source_hash=started.source_hash, configs_total=started.configs_total,
        tasks=started.tasks, queue=started.queue, status_url=f"/ci/{event.commit_sha}?event={event.event}",
        junit_url=f"/sweeps/{started.sweep_id}/junit.xml")


@router.post("/webhooks/ci", status_code=status.HTTP_202_ACCEPTED, response_model=CiWebhookReply,
             responses={200: {"model": CiWebhookReply}, 401: {"model": Problems}, 413: {"model": Problems},
                        422: {"model": Problems}, 503: {"model": Message}},
             # The body is read raw (the signature covers its bytes): declared here, not parsed by FastAPI.
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                 "type": "object", "description": "a GitHub push or pull_request event"}}}}})
async def receive_ci_event(
    request: Request, response: Response, session: SessionDep, celery: CeleryDep, settings: SettingsDep,
    _json: UnsignedWrite,
    signature: Annotated[str | None, Header(alias=HEADER)] = None,
    event_name: Annotated[str | None, Header(alias=EVENT_HEADER)] = None,
    delivery: Annotated[str | None, Header(alias=DELIVERY_HEADER)] = None,
) -> CiWebhookReply:
    """A signed push or pull_request event starts a sweep of the commit's kernels (202); a replay (a
    delivery id, or a signed body, seen before) answers with the sweep it started (200); other
    events are ignored (200)."""
    if not settings.webhook_secret:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the CI webhook is off: ATTNSWEEP_WEBHOOK_SECRET is unset")
    body = await request.body()
    problem = signature_problem(settings.webhook_secret, body, signature)
    if problem is not None:
        raise ProblemError([(HEADER, problem)], status_code=status.HTTP_401_UNAUTHORIZED)
    if not event_name:
        raise ProblemError([(EVENT_HEADER, f"{EVENT_HEADER} is missing: it names the event (push, pull_request)")])
    if event_name == "ping":
        response.status_code = status.HTTP_200_OK
        return CiWebhookReply(status="ignored", event="ping", reason="ping: the webhook reaches attnsweep")
    try:
        parsed = parse_event(event_name, _payload(body))
    except EventError as exc:
        raise ProblemError(exc.problems) from None
    if not isinstance(parsed, Ignored):
        parsed = await run_in_threadpool(_trusted, settings, parsed)
    if isinstance(parsed, Ignored):
        response.status_code = status.HTTP_200_OK
        return CiWebhookReply(status="ignored", event=event_name, reason=parsed.reason)
    if not delivery or len(delivery) > 100 or text_problem(delivery) is not None:
        raise ProblemError([(DELIVERY_HEADER, f"{DELIVERY_HEADER} must be a delivery id of 1 to 100 characters "
                                              "(replays are recognised by it)")])
    # The signature covers the body: the same signed body is the same event whatever its delivery id.
    reply = await run_in_threadpool(_start, session, celery, settings, parsed, delivery, hashlib.sha256(body).hexdigest())
    if reply.status == "replayed":
        response.status_code = status.HTTP_200_OK
    return reply
