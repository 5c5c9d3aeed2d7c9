"""Failure rates over one or two fields, sizes bucketed by powers of two (the dashboard's heatmap).

A size field (`seq_len_k`, `head_dim_qk`, ...) has hundreds of distinct values in a sampled
sweep, too many for a heatmap axis; `<field>_bucket` groups it into [2^k, 2^(k+1) - 1], which
matches the log-uniform draws of docs/spec.md §6. The bucket is a CASE over thresholds rather than
log2(), which SQLite lacks unless compiled with its math functions.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from sqlalchemy import case, select
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


# The config fields a heatmap axis may be, sizes by their power-of-two buckets.
AXIS_FIELDS = ("dtype", "split_kv", "causal", "gqa_ratio", "seq_len_k_bucket", "seq_len_q_bucket", "head_dim_qk_bucket",
               "head_dim_v_bucket", "g_bucket", "num_heads_q", "num_heads_kv", "kv_cache", "has_prefix_offset",
               "with_attn_bias", "with_attn_scale", "return_lse", "trans_q", "trans_k", "trans_v", "trans_o")
DEFAULT_AXES = ("dtype", "split_kv")
# Enough finished configs to rank the pairs; more only cost time (seq order is the random draw order).
AXES_SAMPLE = 2000


def _h(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


# Pseudo-configs at the sweep's own failure rate added to every cell: a cell of one or two
# configs is pure by chance, and would otherwise make a pair of many-valued fields look best.
SMOOTHING = 1.0


def separating_axes(session: Session, sweep_id: int, failing: Sequence[str]) -> tuple[tuple[str, str], float | None]:
    """The pair of config fields whose cells best separate failing from passing configs.

    Score: the information the pair's cells give about the failure flag, in bits per config
    (the entropy of the flag less its mean entropy within the cells), with each cell's failure
    rate smoothed by SMOOTHING pseudo-configs at the sweep's rate; ties go to the pair with fewer
    cells. Fields with one value in the sweep, configs that are not_applicable or unfinished
    are left out. With no failures, or nothing but failures, there is nothing to separate:
    DEFAULT_AXES and score None. Returns ((rows field, columns field), score): the field with
    fewer values first, as the heatmap's rows; the other runs across.
    """
    columns = [_expression(f).label(f) for f in AXIS_FIELDS]
    rows = session.execute(
        select(ConfigRun.outcome, *columns)
        .where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "done", ConfigRun.outcome != "not_applicable")
        .order_by(ConfigRun.seq).limit(AXES_SAMPLE)).all()
    failed = [r[0] in failing for r in rows]
    p0 = sum(failed) / len(rows) if rows else 0.0
    if p0 in (0.0, 1.0):
        return DEFAULT_AXES, None
    prior = _h(p0)
    values = {f: [r[i + 1] for r in rows] for i, f in enumerate(AXIS_FIELDS)}
    fields = [f for f in AXIS_FIELDS if len(set(values[f])) > 1]
    best: tuple[float, int, tuple[str, str]] | None = None
    for i, a in enumerate(fields):
        for b in fields[i + 1:]:
            cells: dict[tuple, list[int]] = {}
            for va, vb, f in zip(values[a], values[b], failed):
                cell = cells.setdefault((va, vb), [0, 0])
                cell[0] += 1
                cell[1] += f
            remainder = sum(n / len(rows) * _h((k + SMOOTHING * p0) / (n + SMOOTHING)) for n, k in cells.values())
            key = (round(prior - remainder, 9), -len(cells), (a, b))
            if best is None or key[:2] > best[:2]:
                best = key
    if best is None:
        return DEFAULT_AXES, None
    a, b = best[2]
    if len(set(values[a])) > len(set(values[b])):
        a, b = b, a
    return (a, b), best[0]
