"""The reads the API serves: sweep lists, a sweep's results, failures and failure summaries.

Filters arrive as plain values (`Match`, `ResultFilter`) so the store knows nothing of HTTP.
Every filter is a condition on a real, indexed column of `config_runs` (or on `sweeps.label`
through the sweep id), so the failure queries stay in SQL on a million stored results.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import BigInteger, Select, and_, bindparam, case, func, select
from sqlalchemy.orm import Session

from attnconfig.config import INT4_MAX, INT8_MAX
from attnconfig.outcomes import COUNT_METRICS, FAILING_OUTCOMES, FLOAT_METRICS, OUTCOMES
from store.models import ConfigRun, FilterCount, Sweep

# Columns a result can be filtered and grouped on, by kind (config fields and derived ones first).
INT_FIELDS = (
    "g", "seq_len_q", "seq_len_k", "num_heads_q", "num_heads_kv", "gqa_ratio", "head_dim_qk", "head_dim_v",
    "split_kv", "data_seed", "block_n", "sweep_id",
)
BOOL_FIELDS = (
    "with_attn_scale", "with_attn_bias", "causal", "has_prefix_offset", "kv_cache",
    "trans_q", "trans_k", "trans_v", "trans_o", "return_lse",
)
STR_FIELDS = (
    "dtype", "backend", "device", "variant", "source_hash", "threshold_reason", "failed_gate",
    "not_applicable_reason", "outcome", "config_hash", "state", "data_regime",
)
FIELD_KINDS: dict[str, str] = {**dict.fromkeys(INT_FIELDS, "int"), **dict.fromkeys(BOOL_FIELDS, "bool"), **dict.fromkeys(STR_FIELDS, "str")}
GROUPABLE = tuple(f for f in FIELD_KINDS if f not in ("config_hash", "data_seed", "outcome", "state"))
TIMING_FIELDS = ("compile_s", "inputs_s", "run_s", "reference_s", "verify_s", "total_s")
SORTABLE = ("finished_at", "id", "seq", *INT_FIELDS, "dtype", "outcome", "failed_gate", *FLOAT_METRICS, *COUNT_METRICS, *TIMING_FIELDS)


def int_bound(column: str) -> int:
    """The largest value a config_runs column holds: int8 for BigInteger columns, else int4."""
    col = ConfigRun.__table__.c.get(column)
    return INT8_MAX if col is not None and isinstance(col.type, BigInteger) else INT4_MAX


@dataclass(frozen=True)
class Match:
    """One column's condition: any of `values`, and/or within the inclusive range [lo, hi]."""

    values: tuple[Any, ...] = ()
    lo: int | None = None
    hi: int | None = None

    def clause(self, column: Any) -> Any:
        parts = []
        if self.values:
            parts.append(column == self.values[0] if len(self.values) == 1 else column.in_(self.values))
        if self.lo is not None:
            parts.append(column >= self.lo)
        if self.hi is not None:
            parts.append(column <= self.hi)
        return and_(*parts)


@dataclass(frozen=True)
class ResultFilter:
    """Conditions on stored results; every one given must hold."""

    matches: dict[str, Match] = field(default_factory=dict)
    label: str | None = None
    since: datetime | None = None  # finished_at >= since
    until: datetime | None = None  # finished_at < until

    def apply(self, query: Select) -> Select:
        for name, match in self.matches.items():
            if name not in FIELD_KINDS:
                raise ValueError(f"{name}: not a filterable field")
            query = query.where(match.clause(getattr(ConfigRun, name)))
        if self.label is not None:
            query = query.where(ConfigRun.sweep_id.in_(select(Sweep.id).where(Sweep.label == self.label)))
        if self.since is not None:
            query = query.where(ConfigRun.finished_at >= self.since)
        if self.until is not None:
            query = query.where(ConfigRun.finished_at < self.until)
        return query


def is_failure() -> Any:
    """The same condition as the partial index ix_config_runs_failures_recent."""
    return ConfigRun.outcome.in_(FAILING_OUTCOMES)


NULLABLE_SORTS = frozenset({"block_n", "failed_gate", "outcome", *FLOAT_METRICS, *COUNT_METRICS, *TIMING_FIELDS})


def _order(sort: str) -> list[Any]:
    """"-finished_at" -> newest first; id breaks ties in the same direction.

    Metrics and timings may be NULL: those rows go last either way. The never-NULL columns keep
    the plain order, so a backward scan of (finished_at, id) serves "-finished_at".
    """
    desc = sort.startswith("-")
    name = sort.lstrip("-")
    if name not in SORTABLE:
        raise ValueError(f"sort: {name!r} is not sortable")
    col = getattr(ConfigRun, name)
    first = col.desc() if desc else col.asc()
    if name in NULLABLE_SORTS:
        first = first.nulls_last()
    if name == "id":
        return [first]
    return [first, ConfigRun.id.desc() if desc else ConfigRun.id.asc()]


def _labelled(query_filter: Any) -> Select:
    return select(ConfigRun, Sweep.label).join(Sweep, Sweep.id == ConfigRun.sweep_id).where(query_filter)


@dataclass
class Page:
    rows: list[tuple[ConfigRun, str | None]]
    count: int | None
    has_more: bool


def _page(session: Session, base: Select, sort: str, offset: int, limit: int, with_count: bool) -> Page:
    rows = list(session.execute(base.order_by(*_order(sort)).offset(offset).limit(limit + 1)))
    count = None
    if with_count:
        count = session.scalar(select(func.count()).select_from(base.with_only_columns(ConfigRun.id).subquery()))
    return Page(rows=rows[:limit], count=count, has_more=len(rows) > limit)


def failures(
    session: Session, flt: ResultFilter, *, sort: str = "-finished_at", offset: int = 0, limit: int = 50,
    with_count: bool = False,
) -> Page:
    """Failing results (docs/spec.md §7 fail, nan, error, timeout, oom) across sweeps, filtered and sorted."""
    base = flt.apply(_labelled(and_(ConfigRun.state == "done", is_failure())))
    return _page(session, base, sort, offset, limit, with_count)


def sweep_results(
    session: Session, sweep_id: int, flt: ResultFilter, *, sort: str = "seq", offset: int = 0, limit: int = 100
) -> Page:
    """Every config of one sweep (queued, done or cancelled), in sampled order by default."""
    base = flt.apply(_labelled(ConfigRun.sweep_id == sweep_id))
    return _page(session, base, sort, offset, limit, with_count=True)


def failure_rate(failures: int, applicable: int) -> float | None:
    """failures / (runs - not_applicable): a config a backend cannot run is neither a pass nor a
    failure. None when there is no applicable run."""
    return failures / applicable if applicable else None


def grouped_outcomes(session: Session, columns: Mapping[str, Any], flt: ResultFilter) -> list[dict[str, Any]]:
    """Outcome counts of finished results per group of `columns` (name -> SQL expression), with
    failure rates; groups sorted by key, None last."""
    # Grouped in an outer query: PostgreSQL would not match a CASE with bound parameters (a
    # bucket of store.analysis) in GROUP BY to the same CASE in SELECT.
    inner = flt.apply(
        select(*(expr.label(name) for name, expr in columns.items()), ConfigRun.outcome.label("outcome"))
        .where(ConfigRun.state == "done")
    ).subquery()
    keys = [inner.c[name] for name in columns]
    groups: dict[tuple, dict[str, int]] = {}
    for *key, outcome, n in session.execute(select(*keys, inner.c.outcome, func.count()).group_by(*keys, inner.c.outcome)):
        groups.setdefault(tuple(key), dict.fromkeys(OUTCOMES, 0))[outcome] = n
    out = []
    for key in sorted(groups, key=lambda k: tuple((v is None, v) for v in k)):
        outcomes = groups[key]
        runs = sum(outcomes.values())
        fails = sum(outcomes[o] for o in FAILING_OUTCOMES)
        out.append({
            "key": dict(zip(columns, key)),
            "runs": runs,
            "failures": fails,
            "failure_rate": failure_rate(fails, runs - outcomes["not_applicable"]),
            "outcomes": outcomes,
        })
    return out


def group_totals(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """runs, failures and failure_rate over every group of grouped_outcomes."""
    runs = sum(g["runs"] for g in groups)
    failures = sum(g["failures"] for g in groups)
    applicable = runs - sum(g["outcomes"]["not_applicable"] for g in groups)
    return {"runs": runs, "failures": failures, "failure_rate": failure_rate(failures, applicable)}


def failure_summary(session: Session, by: Sequence[str], flt: ResultFilter, allowed: Sequence[str] = GROUPABLE,
                    column: Callable[[str], Any] = lambda name: getattr(ConfigRun, name)) -> list[dict[str, Any]]:
    """Outcome counts of finished results grouped by one or two fields of `allowed`, with failure
    rates; `column` gives a field's SQL expression (store.analysis adds size buckets)."""
    if not 1 <= len(by) <= 2:
        raise ValueError("by: give one or two fields")
    for name in by:
        if name not in allowed:
            raise ValueError(f"by: {name!r} cannot be grouped on")
    return grouped_outcomes(session, {name: column(name) for name in by}, flt)


# --- sweeps ----------------------------------------------------------------------------------
def list_sweeps(
    session: Session, *, status: str | None = None, label: str | None = None, offset: int = 0, limit: int = 50
) -> tuple[list[Sweep], int]:
    query = select(Sweep)
    if status is not None:
        query = query.where(Sweep.status == status)
    if label is not None:
        query = query.where(Sweep.label == label)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = list(session.scalars(query.order_by(Sweep.id.desc()).offset(offset).limit(limit)))
    return rows, count


# Built once (GET /sweeps/{id} runs them on every poll; building a statement costs SQLAlchemy
# about as much CPU as running it). The not-applicable reason is a grouping column: it is null
# for every other outcome, so one pass gives the outcomes and the reasons.
_SWEEP_IDS = bindparam("sweep_ids", expanding=True)
_RUN_COUNTS = (select(ConfigRun.sweep_id, ConfigRun.state, ConfigRun.outcome, ConfigRun.not_applicable_reason, func.count(),
                      func.max(ConfigRun.finished_at))
               .where(ConfigRun.sweep_id.in_(_SWEEP_IDS))
               .group_by(ConfigRun.sweep_id, ConfigRun.state, ConfigRun.outcome, ConfigRun.not_applicable_reason))
_FILTER_COUNTS = select(FilterCount.sweep_id, FilterCount.reason, FilterCount.count).where(FilterCount.sweep_id.in_(_SWEEP_IDS))


def sweeps_counts(session: Session, sweep_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """docs/spec.md §8 counts of several sweeps in two queries (store.repo.sweep_counts for one)."""
    ids = list(sweep_ids)
    out = {
        i: {"configs_total": 0, "configs_done": 0, "outcomes": dict.fromkeys(OUTCOMES, 0),
            "not_applicable_reasons": {}, "filtered": {}, "last_finished_at": None}
        for i in ids
    }
    if not ids:
        return out
    for sid, state, outcome, reason, n, last in session.execute(_RUN_COUNTS, {"sweep_ids": ids}):
        c = out[sid]
        c["configs_total"] += n
        if outcome == "not_applicable":
            c["not_applicable_reasons"][reason] = c["not_applicable_reasons"].get(reason, 0) + n
        if state == "done":
            c["configs_done"] += n
            c["outcomes"][outcome] = c["outcomes"].get(outcome, 0) + n
            if last is not None and (c["last_finished_at"] is None or last > c["last_finished_at"]):
                c["last_finished_at"] = last
    for sid, reason, n in session.execute(_FILTER_COUNTS, {"sweep_ids": ids}):
        out[sid]["filtered"][reason] = n
    return out


def sweep_configs(session: Session, sweep_id: int, *, failures_only: bool = False) -> list[dict[str, Any]]:
    """The stored configs of a sweep in sampled order (a rerun's explicit list)."""
    query = select(ConfigRun.config).where(ConfigRun.sweep_id == sweep_id)
    if failures_only:
        query = query.where(ConfigRun.state == "done", is_failure())
    return list(session.scalars(query.order_by(ConfigRun.seq)))


def outcome_backend_dtype_counts(session: Session) -> dict[tuple[str, str, str], int]:
    """Finished configs of every sweep by (outcome, backend, dtype), for /metrics."""
    rows = session.execute(
        select(ConfigRun.outcome, ConfigRun.backend, ConfigRun.dtype, func.count())
        .where(ConfigRun.state == "done", ConfigRun.outcome.is_not(None))
        .group_by(ConfigRun.outcome, ConfigRun.backend, ConfigRun.dtype))
    return {(o, b or "unknown", d): n for o, b, d, n in rows}


def run_time_histogram(session: Session, bounds: Sequence[float]) -> dict[str, tuple[list[tuple[float, int]], float]]:
    """Per backend, cumulative counts of finished configs' total_s at each bound (+inf last) and
    the sum of total_s: a Prometheus histogram computed by one grouped scan in the database."""
    columns = [func.sum(case((ConfigRun.total_s <= b, 1), else_=0)) for b in bounds]
    rows = session.execute(
        select(ConfigRun.backend, func.count(), func.coalesce(func.sum(ConfigRun.total_s), 0.0), *columns)
        .where(ConfigRun.state == "done", ConfigRun.total_s.is_not(None))
        .group_by(ConfigRun.backend))
    out: dict[str, tuple[list[tuple[float, int]], float]] = {}
    for backend, count, total, *cumulative in rows:
        buckets = [(b, int(n or 0)) for b, n in zip(bounds, cumulative)] + [(float("inf"), int(count))]
        out[backend or "unknown"] = (buckets, float(total))
    return out


def count_by_status(session: Session) -> dict[str, int]:
    return {s: n for s, n in session.execute(select(Sweep.status, func.count()).group_by(Sweep.status))}


def queued_config_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(ConfigRun).where(ConfigRun.state == "queued")) or 0
