"""POST /sweeps and its rerun as the submit use case (submit.sweep.submit_sweep) sees them: the
request body in, the 202 body out, a refusal as a 422 naming the field.

Idempotency-Key: a client that retries a POST /sweeps sends the same key and gets the sweep its
first request made (200) instead of a second one; the same key with a different body is a 422
on the key.
"""
from __future__ import annotations

from typing import Any

from celery import Celery

from api.errors import ProblemError
from api.schemas.sweeps import SweepAccepted, SweepCreate
from attnconfig import AttentionConfig
from settings import Settings
from store.db import Session
from submit.sweep import IDEMPOTENCY_FIELD, SubmitError, Submission
from submit.sweep import submit_sweep as submit_use_case

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_IDEMPOTENCY_KEY = 200  # sweeps.idempotency_key is VARCHAR(200)


def check_idempotency_key(key: str | None) -> str | None:
    """The key, or a 422 naming the header: 1 to 200 printable ASCII characters."""
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not all(" " <= ch <= "~" for ch in key):
        raise ProblemError([(IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_IDEMPOTENCY_KEY} printable "
                                                 "ASCII characters (a UUID, say)")])
    return key


def problem_of(exc: SubmitError) -> ProblemError:
    """A refused submission as a 422; the key's field is the header that carried it."""
    return ProblemError([(IDEMPOTENCY_HEADER, f"{IDEMPOTENCY_HEADER} {reason}") if f == IDEMPOTENCY_FIELD else (f, reason)
                         for f, reason in exc.problems])


def accepted(done: Submission) -> SweepAccepted:
    sweep = done.sweep
    return SweepAccepted(
        id=sweep.id, status=sweep.status, queue=sweep.queue, configs_total=sweep.configs_total, tasks=done.tasks,
        seed=sweep.seed, draws=done.draws, filtered=done.filtered, splitkv_budget=sweep.splitkv_budget,
        budget_source=sweep.budget_source, published=done.published, replayed=done.replayed,
    )


def submit_sweep(session: Session, celery: Celery, settings: Settings, body: SweepCreate, *,
                 configs: list[AttentionConfig] | None = None, rerun_of: int | None = None,
                 extra_request: dict[str, Any] | None = None, idempotency_key: str | None = None,
                 submitted_by: str | None = None) -> SweepAccepted:
    key = check_idempotency_key(idempotency_key)
    try:
        done = submit_use_case(session, celery, settings, body.spec(),
                               configs=configs if configs is not None else body.configs, defects=body.defects,
                               sanitize=(body.sanitize, body.sanitize_share) if body.sanitize else None,
                               rerun_of=rerun_of, extra_request=extra_request, idempotency_key=key,
                               submitted_by=submitted_by)
    except SubmitError as exc:
        raise problem_of(exc) from None
    return accepted(done)
