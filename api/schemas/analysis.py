"""Bodies of one sweep's analysis: failure rates per group, failures with the gate they broke."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from api.schemas.common import Metric
from api.schemas.failures import FailureQuery, ResultFilters, SummaryGroup
from api.schemas.sweeps import ConfigRunPublic
from store.analysis import RATE_FIELDS


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
    bug=(int | None, Field(None, ge=1, le=1_000_000, description="only the failures of the sweep's bug N (its clusters "
                                                                  "numbered from 1, largest first: GET /sweeps/{id}/clusters)")),
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
    bug: int | None = Field(default=None, description="the number of the sweep's bug (cluster, from 1, largest first) "
                                                      "this failure belongs to; null until the sweep is triaged")


class FailureRowsPublic(BaseModel):
    data: list[FailureRow]
    count: int
    has_more: bool


class FailureAxes(BaseModel):
    """The heatmap's default axes: the pair of config fields that best separates failures from passes."""

    sweep_id: int = Field(description="id of the sweep")
    by: list[str] = Field(description="[rows field, columns field]: pass them as `by` to failure-rates")
    score: float | None = Field(description="bits of information the pair's cells give about whether a config fails "
                                            "(smoothed; store/analysis.py separating_axes); null when there is nothing "
                                            "to separate (no failures, or only failures): the default pair dtype, split_kv")
