"""Coverage of stored sweeps (docs/spec.md §6 "Coverage"): their finished rows as sweeps.coverage
reads results, so a stored sweep's report is the report of the same results in memory.

A finished row counts with its config, outcome, facts (the run's fact_* values), variant and
block_n; queued and cancelled rows did not run and count nowhere.

A sweep's cell space is its own: the regimes its request drew (`data_regimes`) and the paths
its backend can take (the mma path only on cuda, where the kernels pick it), each with any
its rows reached besides, so a sweep of two regimes is not reported as never reaching the
other four. The prior of a
coverage-guided sweep (`coverage_prior_sweeps`) is the cell counts of the newest finished
sweeps, newest first by id.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import ConfigRun, Sweep
from attnconfig.regimes import DEFAULT_REGIME, REGIMES
from sweeps.coverage import PATHS, RARE, CellCounts, count_cells, coverage_report
from sweeps.spec import MAX_PRIOR_SWEEPS


def _rows(session: Session, sweep_ids: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """(config, outcome, facts, variant, block_n) of the finished rows of the sweeps."""
    query = (select(ConfigRun.config, ConfigRun.outcome, ConfigRun.facts, ConfigRun.variant, ConfigRun.block_n)
             .where(ConfigRun.sweep_id.in_(list(sweep_ids)), ConfigRun.state == "done")
             .order_by(ConfigRun.sweep_id, ConfigRun.seq))
    for config, outcome, facts, variant, block_n in session.execute(query):
        yield config, outcome, facts, variant, block_n


def _mma(session: Session, sweep_id: int) -> bool:
    """Whether the sweep ran (or asked for) cuda: rows without a variant then count on the path
    a device with tensor cores picks."""
    requested = session.scalar(select(Sweep.backend).where(Sweep.id == sweep_id))
    ran = session.scalars(select(ConfigRun.backend).where(ConfigRun.sweep_id == sweep_id,
                                                          ConfigRun.backend.is_not(None)).distinct())
    return "cuda" in {requested, *ran}


def _ordered(names: Iterable[str], order: Sequence[str]) -> list[str]:
    wanted = set(names)
    return [n for n in order if n in wanted] + sorted(wanted - set(order))


def sweep_scope(session: Session, sweep_id: int, counts: CellCounts, mma: bool) -> tuple[list[str], list[str]]:
    """(paths, regimes) of a sweep's cell space (the module docstring)."""
    request = session.scalar(select(Sweep.request).where(Sweep.id == sweep_id)) or {}
    reached_paths = {cell[0] for cell in counts.configs}
    reached_regimes = {cell[1] for cell in counts.configs}
    paths = _ordered({*(PATHS if mma else (p for p in PATHS if p != "mma")), *reached_paths}, PATHS)
    regimes = _ordered({*(request.get("data_regimes") or ()), *reached_regimes} or {DEFAULT_REGIME}, REGIMES)
    return paths, regimes


def sweep_coverage(session: Session, sweep_id: int, *, rare: int = RARE) -> dict[str, Any]:
    """sweeps.coverage.coverage_report of a stored sweep's finished rows over the sweep's cell
    space (sweep_scope), with that space's `paths` and `regimes`."""
    mma = _mma(session, sweep_id)
    counts = count_cells(_rows(session, [sweep_id]), mma=mma)
    paths, regimes = sweep_scope(session, sweep_id, counts, mma)
    report = coverage_report((), paths=paths, regimes=regimes, rare=rare, prior=counts, mma=mma)
    return {"paths": paths, "regimes": regimes, **report}


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
