"""Bisections in the store: the request, the claim of the worker that runs it, its heartbeat and
its result (triage/bisect.py computes it; workers/bisect.py runs it).

Life: `queued` (POST /bisect, or a CI push's triage) -> `running` (a worker's claim) -> `done`
with the first bad commit, or `error` with the reason. A claim is a token: `attempts` after it
was taken. Heartbeats and the result are written only under the token they were claimed with,
so a worker that lost its claim (it was thought dead, and another took the bisection again)
writes nothing, and the result is written once. A `running` row whose heartbeat is older than
its stale limit is put back to `queued` (`requeue_stale`) for the reconciler to publish again.

A CI sweep's bisection of one of its clusters (`cluster_rank`, `cluster_signature`) writes its
first bad commit onto that cluster (Cluster.first_bad_commit) in the transaction that stores
its result, so both are written once, together.

This module stores what triage computed; it imports nothing of triage/, which sits above it.
"""
from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any, Mapping

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.models import Bisection, Cluster, ConfigRun
from store.repo import aware, now

STATUSES = ("queued", "running", "done", "error")
ACTIVE = ("queued", "running")
MAX_ERROR = 4000  # characters of an error's text kept


def create_bisection(session: Session, **fields: Any) -> Bisection:
    """A queued bisection (Bisection's request and link columns); the caller commits."""
    row = Bisection(status="queued", attempts=0, **fields)
    session.add(row)
    session.flush()
    return row


def most_run_backend(session: Session, sweep_id: int) -> str | None:
    """The backend that ran most of the sweep's configs (a CI sweep may name `auto`), None when
    no config recorded one."""
    named = Counter(session.scalars(select(ConfigRun.backend).where(ConfigRun.sweep_id == sweep_id,
                                                                   ConfigRun.backend.is_not(None))))
    return named.most_common(1)[0][0] if named else None


def bisections_for_sweep(session: Session, sweep_id: int) -> list[Bisection]:
    """The bisections a CI sweep started, in the order of its clusters (largest first)."""
    return list(session.scalars(select(Bisection).where(Bisection.sweep_id == sweep_id)
                                .order_by(Bisection.cluster_rank.is_(None), Bisection.cluster_rank, Bisection.id)))


def _of_cluster(sweep_id: int, rank: int, signature: str | None) -> Any:
    # Rank and signature both: a triage computed again may order its clusters differently.
    return (Cluster.sweep_id == sweep_id) & (Cluster.rank == rank) & (Cluster.signature == signature)


def bisected_cluster(session: Session, row: Bisection) -> Cluster | None:
    """The stored cluster a CI bisection is for (None: not a cluster's, or the triage was computed
    again without it)."""
    if row.sweep_id is None or row.cluster_rank is None:
        return None
    return session.scalars(select(Cluster).where(_of_cluster(row.sweep_id, row.cluster_rank,
                                                             row.cluster_signature))).first()


def claim(session: Session, bisection_id: int, *, stale_after_s: float) -> int | None:
    """queued -> running, or a running one whose heartbeat is older than `stale_after_s` (its
    worker died) taken again. Returns the claim's token, None when not taken (done, error, or
    running under a live claim)."""
    row = session.get(Bisection, bisection_id, with_for_update=True)
    if row is None:
        return None
    beat = row.heartbeat_at or row.started_at
    stale = row.status == "running" and (beat is None or aware(beat) < now() - timedelta(seconds=stale_after_s))
    if row.status != "queued" and not stale:
        return None
    t = now()
    row.status, row.attempts, row.started_at, row.heartbeat_at, row.error = "running", row.attempts + 1, t, t, None
    row.tested = []
    session.flush()
    return row.attempts


def _held(bisection_id: int, token: int) -> Any:
    return (Bisection.id == bisection_id) & (Bisection.status == "running") & (Bisection.attempts == token)


def heartbeat(session: Session, bisection_id: int, token: int, tested: list[list[str]] | None = None) -> bool:
    """The claim is alive (and the commits tested so far); False when the claim was lost."""
    values: dict[str, Any] = {"heartbeat_at": now()}
    if tested is not None:
        values["tested"] = tested
    return session.execute(update(Bisection).where(_held(bisection_id, token)).values(**values)).rowcount == 1


def finish(session: Session, bisection_id: int, token: int, result: Mapping[str, Any]) -> bool:
    """Store the result (BisectResult.to_dict) as `done` under the claim; False when it was lost."""
    values = {k: result.get(k) for k in ("first_bad", "steps", "skipped", "tested", "candidates", "runs")}
    if session.execute(update(Bisection).where(_held(bisection_id, token))
                       .values(status="done", finished_at=now(), error=None, **values)).rowcount != 1:
        return False
    row = session.get(Bisection, bisection_id)
    session.refresh(row)
    if row.first_bad and row.sweep_id is not None and row.cluster_rank is not None:
        session.execute(update(Cluster).where(_of_cluster(row.sweep_id, row.cluster_rank, row.cluster_signature))
                        .values(first_bad_commit=row.first_bad))
    return True


def fail(session: Session, bisection_id: int, token: int | None, error: str, *,
         result: Mapping[str, Any] | None = None) -> bool:
    """Store `error` under the claim `token` (None: whatever claim holds it, or none while
    queued: the task itself failed). False when the bisection was not active or the claim lost."""
    cond = _held(bisection_id, token) if token is not None else (
        (Bisection.id == bisection_id) & Bisection.status.in_(ACTIVE))
    values: dict[str, Any] = {"status": "error", "finished_at": now(), "error": error[:MAX_ERROR]}
    for key in ("tested", "runs"):
        if result is not None and result.get(key) is not None:
            values[key] = result[key]
    return session.execute(update(Bisection).where(cond).values(**values)).rowcount == 1


def queued_backend(session: Session, bisection_id: int) -> str | None:
    """The backend of a queued bisection (its task's queue); None when it is not queued."""
    row = session.get(Bisection, bisection_id)
    return row.backend if row is not None and row.status == "queued" else None


def mark_enqueued(session: Session, bisection_id: int) -> None:
    session.execute(update(Bisection).where(Bisection.id == bisection_id).values(enqueued_at=now()))


def unpublished(session: Session) -> list[int]:
    """Queued bisections whose task was not published (the broker refused, or it was put back)."""
    return list(session.scalars(select(Bisection.id).where(Bisection.status == "queued", Bisection.enqueued_at.is_(None))
                                .order_by(Bisection.id)))


def requeue_stale(session: Session, stale_after_s: Any) -> list[int]:
    """Put back to queued (unpublished) every running bisection whose heartbeat is older than
    `stale_after_s(row)` seconds: its worker died. Returns their ids; the caller commits."""
    out = []
    for row in session.scalars(select(Bisection).where(Bisection.status == "running")):
        beat = row.heartbeat_at or row.started_at
        if beat is None or aware(beat) < now() - timedelta(seconds=stale_after_s(row)):
            # The claim stays counted in `attempts`: the dead worker's token no longer holds it.
            row.status, row.enqueued_at = "queued", None
            out.append(row.id)
    session.flush()
    return out


def bisection_public(row: Bisection) -> dict[str, Any]:
    """What GET /bisect/{id} answers."""
    return {
        "id": row.id, "status": row.status, "repo": row.repo, "good": row.good, "bad": row.bad,
        "backend": row.backend, "configs": row.configs, "defects": row.defects, "err_ratio_gate": row.err_ratio_gate,
        "first_bad": row.first_bad, "steps": row.steps, "skipped": row.skipped or [],
        "tested": [{"commit": c, "verdict": v} for c, v in (row.tested or [])], "candidates": row.candidates or [],
        "runs": row.runs, "error": row.error, "attempts": row.attempts, "submitted_by": row.submitted_by,
        "repository": row.repository,
        "commit_sha": row.commit_sha, "sweep_id": row.sweep_id, "cluster": row.cluster_rank,
        "created_at": row.created_at,
        "started_at": row.started_at, "finished_at": row.finished_at,
    }
