"""Failure rates over one or two fields, sizes bucketed by powers of two (the dashboard's heatmap).

A size field (`seq_len_k`, `head_dim_qk`, ...) has hundreds of distinct values in a sampled
sweep, too many for a heatmap axis; `<field>_bucket` groups it into [2^k, 2^(k+1) - 1], which
matches the log-uniform draws of SPEC §6. The bucket is a CASE over thresholds rather than
log2(), which SQLite lacks unless compiled with its math functions.
"""
from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from attnconfig.outcomes import FAILING_OUTCOMES, OUTCOMES
from store.models import ConfigRun
from store.queries import GROUPABLE, ResultFilter

BUCKET_SUFFIX = "_bucket"
BUCKETABLE = ("g", "seq_len_q", "seq_len_k", "head_dim_qk", "head_dim_v")
_MAX_POWER = 30  # the last bucket, [2^30, 2^31 - 1], ends where 32-bit int columns do
RATE_FIELDS = (*(f for f in GROUPABLE if f != "sweep_id"), *(f + BUCKET_SUFFIX for f in BUCKETABLE))


def bucket_bounds(floor: int) -> tuple[int, int]:
    """The inclusive range of values a power-of-two bucket stands for."""
    return floor, 2 * floor - 1


def _expression(name: str) -> Any:
    if name.endswith(BUCKET_SUFFIX):
        column = getattr(ConfigRun, name.removesuffix(BUCKET_SUFFIX))
        return case(*((column < 2 ** (k + 1), 2 ** k) for k in range(_MAX_POWER)), else_=2 ** _MAX_POWER)
    return getattr(ConfigRun, name)


def _sort_key(key: tuple) -> tuple:
    return tuple((v is None, v) for v in key)


def failure_rates(session: Session, by: Sequence[str], flt: ResultFilter) -> list[dict[str, Any]]:
    """Outcome counts of finished results per group of `by` (fields of RATE_FIELDS), with rates.

    `failure_rate` = failures / (runs - not_applicable), as GET /failures/summary: a config the
    backend cannot run is neither a pass nor a failure. None where no applicable run exists.
    """
    if not 1 <= len(by) <= 2:
        raise ValueError("by: give one or two fields")
    for name in by:
        if name not in RATE_FIELDS:
            raise ValueError(f"by: {name!r} cannot be grouped on")
    # Grouped in an outer query: PostgreSQL would not match a CASE with bound parameters in
    # GROUP BY to the same CASE in SELECT.
    inner = flt.apply(
        select(*(_expression(n).label(n) for n in by), ConfigRun.outcome.label("outcome")).where(ConfigRun.state == "done")
    ).subquery()
    keys = [inner.c[n] for n in by]
    groups: dict[tuple, dict[str, int]] = {}
    for *key, outcome, n in session.execute(select(*keys, inner.c.outcome, func.count()).group_by(*keys, inner.c.outcome)):
        groups.setdefault(tuple(key), dict.fromkeys(OUTCOMES, 0))[outcome] = n
    out = []
    for key in sorted(groups, key=_sort_key):
        outcomes = groups[key]
        runs = sum(outcomes.values())
        failures = sum(outcomes[o] for o in FAILING_OUTCOMES)
        applicable = runs - outcomes["not_applicable"]
        out.append({"key": dict(zip(by, key)), "runs": runs, "failures": failures,
                    "failure_rate": failures / applicable if applicable else None, "outcomes": outcomes})
    return out

