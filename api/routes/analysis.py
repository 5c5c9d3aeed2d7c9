"""One sweep's analysis: failure rates over one or two fields, its failures with the gate each broke,
its coverage of the config space.

These are the endpoints the dashboard's sweep page reads (api/dashboard); external dashboards
read the same ones.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.convert import config_run_public, gate_check, rate_cell
from api.deps import SweepId, SessionDep, sweep_or_404
from api.filters import parse_by, parse_sort, result_filter
from api.schemas.analysis import (
    FailureAxes,
    FailureRates,
    FailureRatesQuery,
    FailureRow,
    FailureRowsPublic,
    SweepFailuresQuery,
)
from api.schemas.common import Message, Problems
from api.schemas.coverage import CoverageReport
from api.errors import ProblemError
from store import analysis, queries
from store.clusters import bug_numbers, stored_clusters, triage_status
from store.queries import Match, ResultFilter
from sweeps.coverage import FEATURES, RARE

router = APIRouter(prefix="/sweeps", tags=["analysis"])
ERRORS = {404: {"model": Message}, 422: {"model": Problems}}


def _in_sweep(flt: ResultFilter, sweep_id: int) -> ResultFilter:
    return ResultFilter(matches={**flt.matches, "sweep_id": Match(values=(sweep_id,))}, label=flt.label,
                        since=flt.since, until=flt.until)


@router.get("/{sweep_id}/failure-rates", response_model=FailureRates, responses=ERRORS)
def read_failure_rates(sweep_id: SweepId, query: Annotated[FailureRatesQuery, Query()], session: SessionDep) -> FailureRates:  # type: ignore[valid-type]
    """Failure rates of the sweep's finished configs per value of one or two fields (a heatmap).

    Size fields also come bucketed by powers of two: `seq_len_k_bucket`, `head_dim_qk_bucket`, ...
    Every filter of GET /failures/summary applies. Each cell names the query parameters that
    select its configs (`filter`), e.g. `{"dtype": "bf16", "seq_len_k": "256:511"}`.
    """
    sweep_or_404(session, sweep_id)
    by = parse_by(query.by, analysis.RATE_FIELDS)
    groups = analysis.failure_rates(session, by, _in_sweep(result_filter(query, failures_only=False), sweep_id))
    axes = {name: list(dict.fromkeys(g["key"][name] for g in sorted(groups, key=lambda g: (g["key"][name] is None, g["key"][name]))))
            for name in by}
    return FailureRates(sweep_id=sweep_id, by=by, axes=axes, **queries.group_totals(groups),
                        cells=[rate_cell(g) for g in groups])


@router.get("/{sweep_id}/failure-axes", response_model=FailureAxes, responses=ERRORS)
def read_failure_axes(sweep_id: SweepId, session: SessionDep) -> FailureAxes:
    """The two config fields whose failure-rate heatmap best separates the sweep's failures from
    its passes (the information its cells give about failing); sizes come as power-of-two buckets."""
    from attnconfig.outcomes import FAILING_OUTCOMES

    sweep_or_404(session, sweep_id)
    (rows, cols), score = analysis.separating_axes(session, sweep_id, FAILING_OUTCOMES)
    return FailureAxes(sweep_id=sweep_id, by=[rows, cols], score=score)


@router.get("/{sweep_id}/coverage", response_model=CoverageReport, responses=ERRORS)
def read_coverage(sweep_id: SweepId, session: SessionDep,
                  rare: Annotated[int, Query(ge=1, le=1_000_000, description="a cell with fewer configs (and at least "
                                                                                 "one) is rare")] = RARE) -> CoverageReport:
    """Which cells (kernel path, data regime, feature, value) the sweep's finished configs reached:
    covered (at least `rare` configs), rare or never, in total, per regime and per path, with
    every cell's configs and failing configs (docs/spec.md §6 "Coverage")."""
    from store.coverage import sweep_coverage

    sweep_or_404(session, sweep_id)
    report = sweep_coverage(session, sweep_id, rare=rare)
    return CoverageReport(sweep_id=sweep_id, features={f: list(v) for f, v in FEATURES.items()}, **report)


@router.get("/{sweep_id}/failures", response_model=FailureRowsPublic, responses=ERRORS)
def read_sweep_failures(sweep_id: SweepId, query: Annotated[SweepFailuresQuery, Query()], session: SessionDep) -> FailureRowsPublic:  # type: ignore[valid-type]
    """The sweep's failures (fail, nan, fault, unsafe, error, timeout, oom), filtered, sorted and paged as GET
    /failures; each with `check`: the metric that decided it against its bound, and why that bound."""
    sweep_or_404(session, sweep_id)
    flt = _in_sweep(result_filter(query, failures_only=True), sweep_id)
    if query.bug is not None:
        flt.matches["config_hash"] = Match(values=_bug_hashes(session, sweep_id, query.bug) or ("",))
    page = queries.failures(session, flt, sort=parse_sort(query.sort), offset=query.offset, limit=query.limit, with_count=True)
    bugs = bug_numbers(session, [sweep_id])
    rows = []
    for run, label in page.rows:
        public = config_run_public(run, label)
        rows.append(FailureRow(**public.model_dump(), check=gate_check(public), bug=bugs.get((sweep_id, run.config_hash))))
    return FailureRowsPublic(data=rows, count=page.count or 0, has_more=page.has_more)


def _bug_hashes(session: SessionDep, sweep_id: int, bug: int) -> tuple[str, ...]:
    if triage_status(session, sweep_id) != "done":
        raise ProblemError([("bug", f"bug={bug}: sweep {sweep_id} is not triaged (GET /sweeps/{sweep_id}/clusters)")])
    clusters = stored_clusters(session, sweep_id)
    if bug > len(clusters):
        raise ProblemError([("bug", f"bug={bug}: sweep {sweep_id} has {len(clusters)} bug{'s' if len(clusters) != 1 else ''}")])
    return tuple(clusters[bug - 1].config_hashes)
