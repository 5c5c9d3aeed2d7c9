"""Coverage of stored sweeps (docs/spec.md §6 "Coverage"): their finished rows as sweeps.coverage
reads results, so a stored sweep's report is the report of the same results in memory.

A finished row counts with its config, outcome, facts (the run's fact_* values), variant and
block_n; queued and cancelled rows did not run and count nowhere. The prior of a
coverage-guided sweep (`coverage_prior_sweeps`) is the cell counts of the newest finished
sweeps, newest first by id.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import ConfigRun, Sweep
from sweeps.coverage import RARE, CellCounts, count_cells, coverage_report
from sweeps.spec import MAX_PRIOR_SWEEPS


def _rows(session: Session, sweep_ids: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """(config, outcome, facts, variant, block_n) of the finished rows of the sweeps."""
    query = (select(ConfigRun.config, ConfigRun.outcome, ConfigRun.facts, ConfigRun.variant, ConfigRun.block_n)
             .where(ConfigRun.sweep_id.in_(list(sweep_ids)), ConfigRun.state == "done")
             .order_by(ConfigRun.sweep_id, ConfigRun.seq))
    for config, outcome, facts, variant, block_n in session.execute(query):
        yield config, outcome, facts, variant, block_n


def _mma(session: Session, sweep_id: int) -> bool:
    """Rows without a variant count on the path a cuda device would pick for a cuda sweep."""
    return session.scalar(select(Sweep.backend).where(Sweep.id == sweep_id)) == "cuda"


def sweep_coverage(session: Session, sweep_id: int, *, rare: int = RARE) -> dict[str, Any]:
    """sweeps.coverage.coverage_report of a stored sweep's finished rows."""
    return coverage_report(_rows(session, [sweep_id]), rare=rare, mma=_mma(session, sweep_id))


def prior_sweep_ids(session: Session, n: int, *, before: int | None = None) -> list[int]:
    """The ids of the newest `n` finished (status done) sweeps, newest first; `before`: only
    sweeps with a smaller id."""
    if n <= 0:
        return []
    query = select(Sweep.id).where(Sweep.status == "done")
    if before is not None:
        query = query.where(Sweep.id < before)
    return list(session.scalars(query.order_by(Sweep.id.desc()).limit(min(n, MAX_PRIOR_SWEEPS))))


def prior_counts(session: Session, n: int, *, mma: bool = False, before: int | None = None) -> CellCounts:
    """Cell counts of the newest `n` finished sweeps (prior_sweep_ids): a guided sweep's prior."""
    ids = prior_sweep_ids(session, n, before=before)
    return count_cells(_rows(session, ids), mma=mma) if ids else CellCounts()
