"""Bodies of one sweep's analysis: failure rates per group, failures with the gate they broke."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from api.schemas.common import Metric
from api.schemas.failures import FailureQuery, ResultFilters, SummaryGroup
from api.schemas.sweeps import ConfigRunPublic
from store.analysis import BUCKET_SUFFIX, RATE_FIELDS, bucket_bounds
from attnconfig import parse_config
from sweeps.policy import SATURATED_HEAD_DIM, Verdict, evaluate_with_gates


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt parameter is a 422, not ignored


def _fields_of(model: type[BaseModel], *dropped: str) -> dict[str, Any]:
    return {k: (f.annotation, f) for k, f in model.model_fields.items() if k not in dropped}


# The path names the sweep, so `sweep` is not a parameter here (it would be a 422 if given).
SweepFilters = _fields_of(ResultFilters, "sweep")

FailureRatesQuery = create_model(
    "FailureRatesQuery", __base__=_Query, **SweepFilters,
    by=(list[str], Field(..., description=f"repeat once or twice (by=dtype&by=split_kv), or comma-separated; one of: "
                                           f"{', '.join(RATE_FIELDS)}")),
)

SweepFailuresQuery = create_model(
    "SweepFailuresQuery", __base__=_Query, **_fields_of(FailureQuery, "sweep", "with_count", "sort"),
    sort=(str, Field("seq", description="a column; prefix - for descending (default: sampled order)")),
)


class RateCell(SummaryGroup):
    label: dict[str, str] = Field(description="each key value as shown on an axis (a bucket as LO-HI)")
    filter: dict[str, str] = Field(description="query parameters that select this group's configs")


class FailureRates(BaseModel):
    sweep_id: int
    by: list[str]
    axes: dict[str, list[Any]] = Field(description="each field's values in order (null last)")
    runs: int
    failures: int
    failure_rate: float | None
    cells: list[RateCell]


def _shown(name: str, value: Any) -> tuple[str, str]:
    """(axis label, filter value) of one group key."""
    if value is None:
        return "none", ""
    if name.endswith(BUCKET_SUFFIX):
        lo, hi = bucket_bounds(value)
        return (str(lo) if lo == hi else f"{lo}-{hi}"), f"{lo}:{hi}"
    if isinstance(value, bool):
        return str(value).lower(), str(value).lower()
    return str(value), str(value)


def rate_cell(group: dict[str, Any]) -> RateCell:
    label, flt = {}, {}
    for name, value in group["key"].items():
        label[name], shown = _shown(name, value)
        if value is not None:
            flt[name.removesuffix(BUCKET_SUFFIX)] = shown
    return RateCell(**group, label=label, filter=flt)


# --- failures with the gate they broke -----------------------------------------------------------
class GateCheck(BaseModel):
    """The metric that decided a failure, against its bound, and where the bound comes from."""

    gate: str | None
    metric: str | None
    value: Metric
    bound: Metric
    why: str = Field(description="where the bound comes from, or what went wrong when no gate decided")


class FailureRow(ConfigRunPublic):
    check: GateCheck


class FailureRowsPublic(BaseModel):
    data: list[FailureRow]
    count: int
    has_more: bool


THRESHOLD_WHY = {
    "explicit": "the config's own rms_threshold",
    "saturated_softmax": f"saturated softmax: with_attn_scale=false and head_dim_qk > {SATURATED_HEAD_DIM}",
    "bf16": "bf16 threshold",
    "default": "default threshold (f16, f32, i8)",
    "strict": "verify's strict threshold",
}


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def _verdict(run: ConfigRunPublic) -> Verdict | None:
    """The stored failure's verdict, re-derived by the policy that made it from its metrics and
    gates; None for outcomes no gate decides (error, timeout, oom) or rows that cannot be judged."""
    if run.outcome not in ("fail", "nan") or not run.gates:
        return None
    try:
        verdict = evaluate_with_gates(parse_config(run.config), run.metrics, run.gates)
    except (ValueError, KeyError):
        return None
    return verdict if (verdict.outcome, verdict.failed_gate) == (run.outcome, run.failed_gate) else None


def gate_check(run: ConfigRunPublic) -> GateCheck:
    """The metric that decided a stored failure against its bound (docs/spec.md §5, sweeps.policy)."""
    verdict = _verdict(run)
    if verdict is None:
        return GateCheck(gate=run.failed_gate, metric=None, value=None, bound=None,
                         why=_first_line(run.detail) or run.outcome or "")
    why = verdict.why
    if verdict.outcome == "fail" and verdict.failed_gate == "rms":
        why = THRESHOLD_WHY.get(run.threshold_reason or "", why)
    return GateCheck(gate=verdict.failed_gate, metric=verdict.metric, value=verdict.value, bound=verdict.bound, why=why)


class FailureAxes(BaseModel):
    """The heatmap's default axes: the pair of config fields that best separates failures from passes."""

    sweep_id: int = Field(description="id of the sweep")
    by: list[str] = Field(description="[rows field, columns field]: pass them as `by` to failure-rates")
    score: float | None = Field(description="bits of information the pair's cells give about whether a config fails "
                                            "(smoothed; store/analysis.py separating_axes); null when there is nothing "
                                            "to separate (no failures, or only failures): the default pair dtype, split_kv")
