"""Failure rates over one or two fields, sizes bucketed by powers of two (the dashboard's heatmap).

A size field (`seq_len_k`, `head_dim_qk`, ...) has hundreds of distinct values in a sampled
sweep, too many for a heatmap axis; `<field>_bucket` groups it into [2^k, 2^(k+1) - 1], which
matches the log-uniform draws of docs/spec.md §6. The bucket is a CASE over thresholds rather than
log2(), which SQLite lacks unless compiled with its math functions.
"""
from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import case
from sqlalchemy.orm import Session

from store.models import ConfigRun
from store.queries import GROUPABLE, ResultFilter, failure_summary

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


def failure_rates(session: Session, by: Sequence[str], flt: ResultFilter) -> list[dict[str, Any]]:
    """GET /failures/summary's groups over one or two fields of RATE_FIELDS, size buckets included."""
    return failure_summary(session, by, flt, allowed=RATE_FIELDS, column=_expression)
