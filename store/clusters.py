"""A sweep's triage in the store: its state (pending, running, done, failed) and its clusters.

A finished service sweep is owed a triage: repo.finish_if_complete writes its `pending` row in
the transaction that ends the sweep, and a worker claims it (`claim_triage`), computes the
clusters and stores them (`store_clusters`) or the reason it could not (`fail_triage`). The
clusters of a sweep are replaced as a whole, in one transaction, so a triage that runs twice
(a task delivered again, `attnsweep triage --recompute`) leaves one set of clusters, never two.

Status of a sweep without a row: `pending` while the sweep is queued or running (its triage
follows its end), `none` once it ended (an embedded run with --no-triage, a failed or cancelled
sweep, a sweep stored before revision 0006).

A cluster's `first_bad_commit` is written by the CI bisection of it (store/bisections.py: with
that bisection's result), found by the sweep, rank and signature the bisection recorded; the
clusters stored again by a recomputed triage keep it where rank and signature still match.

This module stores what triage (triage.cluster.Cluster.to_dict) computed; it imports nothing of
triage/, which sits above the store.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Mapping, Sequence

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from store.models import Bisection, Cluster, Sweep, SweepTriage
from store.repo import ACTIVE_STATUSES, aware, now

STATUSES = ("none", "pending", "running", "done", "failed")
MAX_ERROR = 2000  # characters of a failed triage's reason kept


def request_triage(session: Session, sweep_id: int) -> bool:
    """A `pending` row for the sweep unless it has one; True when written."""
    if session.get(SweepTriage, sweep_id) is not None:
        return False
    session.add(SweepTriage(sweep_id=sweep_id, status="pending"))
    session.flush()
    return True


def triage_row(session: Session, sweep_id: int) -> SweepTriage | None:
    return session.get(SweepTriage, sweep_id)


def triage_status(session: Session, sweep_id: int) -> str:
    """One of STATUSES (see the module docstring for a sweep without a row)."""
    row = session.get(SweepTriage, sweep_id)
    if row is not None:
        return row.status
    status = session.scalar(select(Sweep.status).where(Sweep.id == sweep_id))
    return "pending" if status in ACTIVE_STATUSES else "none"


def claim_triage(session: Session, sweep_id: int, *, stale_after_s: float, force: bool = False) -> bool:
    """Take the sweep's triage: pending (or no row) -> running. A `running` row older than
    `stale_after_s` is taken again (its worker died: the task's hard limit ended it or the
    process was killed); a `done` or `failed` one only with `force`. True when taken: the
    caller then stores clusters or a failure."""
    row = session.get(SweepTriage, sweep_id, with_for_update=True)
    if row is None:
        session.add(SweepTriage(sweep_id=sweep_id, status="running", started_at=now()))
        session.flush()
        return True
    stale = row.status == "running" and (row.started_at is None or aware(row.started_at) < now() - timedelta(seconds=stale_after_s))
    if row.status == "pending" or stale or force:
        row.status, row.started_at, row.finished_at, row.error = "running", now(), None, None
        session.flush()
        return True
    return False


def _signature_label(signature: Any) -> str:
    if isinstance(signature, str):
        return signature
    return f"{signature['outcome']}/{signature.get('gate') or '-'}/{signature['location']}"


def signature_label(signature: Any) -> str:
    """The label a cluster's signature (Cluster.to_dict's, or a label) is stored under."""
    return _signature_label(signature)


def _signature_dict(label: str) -> dict[str, str | None]:
    outcome, gate, location = label.split("/", 2)
    return {"outcome": outcome, "gate": None if gate == "-" else gate, "location": location}


def store_clusters(session: Session, sweep_id: int, clusters: Sequence[Mapping[str, Any]]) -> None:
    """Replace the sweep's clusters with these (Cluster.to_dict() dicts, largest first) and mark
    its triage done. A cluster that a finished CI bisection was for (the same rank and signature)
    keeps the first bad commit it found."""
    found = {(b.cluster_rank, b.cluster_signature): b.first_bad for b in _bisections(session, sweep_id)
             if b.status == "done" and b.first_bad}
    session.execute(delete(Cluster).where(Cluster.sweep_id == sweep_id))
    runs = 0
    for rank, c in enumerate(clusters):
        detail = c.get("classification")
        runs += c.get("runs") or 0
        session.add(Cluster(
            sweep_id=sweep_id, rank=rank, signature=_signature_label(c["signature"]), size=c["size"],
            signatures=dict(c.get("signatures") or {}), explanation=dict(c["explanation"]),
            config_hashes=list(c.get("config_hashes") or []), example_config=dict(c["example_config"]),
            minimal_config=c.get("minimal_config"), reproducer=c.get("reproducer"),
            reproducer_signature=_signature_label(c["reproducer_signature"]) if c.get("reproducer_signature") else None,
            classification=detail.get("kind") if detail else None, classification_detail=detail,
            first_bad_commit=c.get("first_bad_commit") or found.get((rank, _signature_label(c["signature"]))),
            runs=c.get("runs")))
    _finish(session, sweep_id, "done", runs=runs)


def release_triage(session: Session, sweep_id: int) -> None:
    """A running triage that was interrupted (its worker shut down, the database went away)
    goes back to `pending` and unpublished: the reconciler publishes its task again, as for a
    triage whose task the broker never took."""
    session.execute(update(SweepTriage).where(SweepTriage.sweep_id == sweep_id, SweepTriage.status == "running")
                    .values(status="pending", started_at=None, enqueued_at=None))


def fail_triage(session: Session, sweep_id: int, reason: str) -> None:
    """The triage could not be computed: `failed` with the reason (the sweep itself is unchanged)."""
    _finish(session, sweep_id, "failed", error=reason[:MAX_ERROR])


def _finish(session: Session, sweep_id: int, status: str, *, runs: int | None = None, error: str | None = None) -> None:
    row = session.get(SweepTriage, sweep_id)
    if row is None:
        row = SweepTriage(sweep_id=sweep_id)
        session.add(row)
    row.status, row.error, row.runs, row.finished_at = status, error, runs, now()
    session.flush()


def triage_backend(session: Session, sweep_id: int) -> str | None:
    """The backend of the sweep whose triage is to be published (its task's queue); None when there is no such sweep."""
    sweep = session.get(Sweep, sweep_id)
    return sweep.backend if sweep is not None else None


def mark_enqueued(session: Session, sweep_id: int) -> None:
    session.execute(update(SweepTriage).where(SweepTriage.sweep_id == sweep_id).values(enqueued_at=now()))


def unpublished(session: Session) -> list[int]:
    """Sweeps whose triage is pending and whose task was not published yet (the reconciler's)."""
    return list(session.scalars(select(SweepTriage.sweep_id).where(SweepTriage.status == "pending",
                                                                   SweepTriage.enqueued_at.is_(None))
                                .order_by(SweepTriage.sweep_id)))


def stored_clusters(session: Session, sweep_id: int) -> list[Cluster]:
    """The sweep's clusters, largest first."""
    return list(session.scalars(select(Cluster).where(Cluster.sweep_id == sweep_id).order_by(Cluster.rank)))


def bug_numbers(session: Session, sweep_ids: Sequence[int]) -> dict[tuple[int, str], int]:
    """(sweep id, config hash) -> the number of the bug (1 for the largest cluster, as `attnsweep
    triage` and `run` number them) of each failing config of these sweeps' stored triages."""
    rows = session.execute(select(Cluster.sweep_id, Cluster.rank, Cluster.config_hashes)
                           .where(Cluster.sweep_id.in_(sorted(set(sweep_ids)))))
    return {(sweep_id, h): rank + 1 for sweep_id, rank, hashes in rows for h in hashes}


# One query, built once: GET /sweeps/{id} asks on every poll.
_BUG_COUNTS = (select(SweepTriage.sweep_id, func.count(Cluster.id))
               .outerjoin(Cluster, Cluster.sweep_id == SweepTriage.sweep_id)
               .where(SweepTriage.sweep_id.in_(bindparam("sweep_ids", expanding=True)), SweepTriage.status == "done")
               .group_by(SweepTriage.sweep_id))


def bug_counts(session: Session, sweep_ids: Sequence[int]) -> dict[int, int]:
    """Sweep id -> its bugs (stored clusters), for the sweeps among these whose triage is done."""
    ids = sorted(set(sweep_ids))
    if not ids:
        return {}
    return dict(session.execute(_BUG_COUNTS, {"sweep_ids": ids}).all())


def _bisections(session: Session, sweep_id: int) -> list[Bisection]:
    return list(session.scalars(select(Bisection).where(Bisection.sweep_id == sweep_id,
                                                        Bisection.cluster_rank.is_not(None))))


def cluster_public(c: Cluster, bisection: Bisection | None = None) -> dict[str, Any]:
    """A stored cluster with the keys of triage's JSON (`attnsweep triage --json`), and the CI
    bisection of it, if any."""
    return {
        "size": c.size, "signature": _signature_dict(c.signature), "signatures": c.signatures,
        "explanation": c.explanation, "example_config": c.example_config, "minimal_config": c.minimal_config,
        "reproducer": c.reproducer,
        "reproducer_signature": _signature_dict(c.reproducer_signature) if c.reproducer_signature else None,
        "classification": c.classification_detail, "first_bad_commit": c.first_bad_commit,
        "runs": c.runs, "config_hashes": c.config_hashes,
        "bisection": {"id": bisection.id, "status": bisection.status} if bisection is not None else None,
    }


def clusters_report(session: Session, sweep_id: int) -> dict[str, Any]:
    """{"status", "error", "clusters"}: what GET /sweeps/{id}/clusters answers."""
    row = session.get(SweepTriage, sweep_id)
    status = triage_status(session, sweep_id)
    clusters = []
    if status == "done":
        of = {(b.cluster_rank, b.cluster_signature): b for b in _bisections(session, sweep_id)}
        clusters = [cluster_public(c, of.get((c.rank, c.signature))) for c in stored_clusters(session, sweep_id)]
    return {"status": status, "error": row.error if row is not None else None, "clusters": clusters}
