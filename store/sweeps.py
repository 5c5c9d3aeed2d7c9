"""Reads of one sweep and its stored configs."""
from __future__ import annotations

from typing import Iterator

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from store.models import ConfigRun, Sweep


def get_sweep(session: Session, sweep_id: int) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def sweep_by_idempotency_key(session: Session, key: str) -> Sweep | None:
    """The sweep a submission with this Idempotency-Key stored, if any."""
    return session.scalar(select(Sweep).where(Sweep.idempotency_key == key))


def unpublished_configs(session: Session, sweep_id: int) -> int:
    """The sweep's queued configs not yet on the broker (the reconciler publishes them)."""
    return session.scalar(select(func.count()).select_from(ConfigRun).where(
        ConfigRun.sweep_id == sweep_id, ConfigRun.state == "queued", ConfigRun.enqueued_at.is_(None))) or 0


def runs_in_order(session: Session, sweep_id: int) -> Iterator[ConfigRun]:
    """Every stored config of the sweep in sampled order, read a thousand rows at a time."""
    return iter(session.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id).order_by(ConfigRun.seq)
                                .execution_options(yield_per=1000)))


def judged_runs(session: Session, sweep_id: int) -> list[ConfigRun]:
    """The sweep's configs that have an outcome (queued ones have none yet), in sampled order."""
    return list(session.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id, ConfigRun.outcome.is_not(None))
                                .order_by(ConfigRun.seq)))


def judged_backends_and_reproducers(session: Session, sweep_id: int) -> list[tuple[str | None, str | None]]:
    """(backend, reproducer) of each config of the sweep that has an outcome."""
    return [tuple(row) for row in session.execute(
        select(ConfigRun.backend, ConfigRun.reproducer).where(ConfigRun.sweep_id == sweep_id,
                                                              ConfigRun.outcome.is_not(None))).all()]


def backend_that_ran(session: Session, sweep_id: int) -> str | None:
    """The backend a stored result names (`auto` resolved to cuda, hip or cpu); None before any."""
    return session.scalar(select(ConfigRun.backend).where(ConfigRun.sweep_id == sweep_id,
                                                          ConfigRun.backend.is_not(None)).limit(1))
