"""Bodies of one sweep's analysis: failure rates per group, failures with the gate they broke."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from api.schemas.common import Metric
from api.schemas.failures import FailureQuery, ResultFilters, SummaryGroup
from api.schemas.sweeps import ConfigRunPublic
from store.analysis import BUCKET_SUFFIX, RATE_FIELDS, bucket_bounds
from sweeps.policy import SATURATED_HEAD_DIM


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
NONFINITE_METRIC = {"rms": "out_nonfinite", "lse": "lse_nonfinite", "partials": "partials_nonfinite"}


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def _over(value: Any, bound: Any) -> bool:
    return value is not None and bound is not None and not (value <= bound)


def gate_check(run: ConfigRunPublic) -> GateCheck:
    """SPEC §5's gates as sweeps.policy applies them, read back from a stored failure."""
    m, g, gate, dtype = run.metrics, run.gates or {}, run.failed_gate, run.config.get("dtype")
    if run.outcome == "nan" and gate in NONFINITE_METRIC:
        metric = NONFINITE_METRIC[gate]
        return GateCheck(gate=gate, metric=metric, value=m.get(metric), bound=0, why="non-finite values where the reference is finite")
    if gate == "rms":
        return GateCheck(gate=gate, metric="out_rms", value=m.get("out_rms"), bound=g.get("rms", run.rms_threshold),
                         why=THRESHOLD_WHY.get(run.threshold_reason or "", run.threshold_reason or "threshold"))
    if gate == "row":
        return GateCheck(gate=gate, metric="out_row_err", value=m.get("out_row_err"), bound=g.get("row"), why=f"{dtype} row bound")
    if gate == "lse":
        if (m.get("lse_inf_mismatch") or 0) > 0:
            return GateCheck(gate=gate, metric="lse_inf_mismatch", value=m["lse_inf_mismatch"], bound=0,
                             why="a -inf LSE must match the reference's")
        return GateCheck(gate=gate, metric="lse_max_abs", value=m.get("lse_max_abs"), bound=g.get("lse"), why=f"{dtype} LSE bound")
    if gate == "partials":
        if _over(m.get("partials_row_err"), g.get("row")):
            return GateCheck(gate=gate, metric="partials_row_err", value=m["partials_row_err"], bound=g.get("row"),
                             why=f"{dtype} row bound, per valid split")
        if _over(m.get("partials_lse_max_abs"), g.get("lse")):
            return GateCheck(gate=gate, metric="partials_lse_max_abs", value=m["partials_lse_max_abs"], bound=g.get("lse"),
                             why=f"{dtype} LSE bound, per valid split")
        return GateCheck(gate=gate, metric="partials_invalid_bad", value=m.get("partials_invalid_bad"), bound=0,
                         why="an invalid or empty split must be exactly O=0, LSE=-inf")
    if gate == "err_ratio":
        return GateCheck(gate=gate, metric="out_err_ratio", value=m.get("out_err_ratio"), bound=g.get("err_ratio"),
                         why="the sweep's err_ratio_gate")
    return GateCheck(gate=gate, metric=None, value=None, bound=None, why=_first_line(run.detail) or run.outcome or "")
