"""Failure queries: the filters (query parameters) and the summary body."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from attnconfig.config import INT8_MAX
from pydantic import BaseModel, ConfigDict, Field, create_model

from store.queries import BOOL_FIELDS, GROUPABLE, INT_FIELDS

STR_FILTERS = ("dtype", "data_regime", "backend", "device", "variant", "source_hash", "threshold_reason",
               "not_applicable_reason")
INT_FORMS = "N, A,B,C (any of) or LO:HI (inclusive; either end may be left open)"


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown (misspelt) parameter is a 422, not ignored


def _filter_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {
        "outcome": (str | None, Field(None, description="one outcome or a comma-separated list")),
        "gate": (str | None, Field(None, description="the failed gate: rms, row, lse, partials, err_ratio (comma-separated list)")),
        "sweep": (str | None, Field(None, description=f"sweep id: {INT_FORMS}")),
        "label": (str | None, Field(None, description="label of the sweep")),
        "since": (datetime | None, Field(None, description="finished at or after (ISO 8601)")),
        "until": (datetime | None, Field(None, description="finished before (ISO 8601)")),
    }
    for name in INT_FIELDS:
        if name != "sweep_id":
            fields[name] = (str | None, Field(None, description=f"{name}: {INT_FORMS}"))
    for name in BOOL_FIELDS:
        fields[name] = (bool | None, Field(None))
    for name in STR_FILTERS:
        fields[name] = (str | None, Field(None, description=f"{name}: one value or a comma-separated list"))
    return fields


ResultFilters = create_model("ResultFilters", __base__=_Query, **_filter_fields())

FailureQuery = create_model(
    "FailureQuery",
    __base__=ResultFilters,
    sort=(str, Field("-finished_at", description="a column; prefix - for descending (default: newest first)")),
    limit=(int, Field(50, ge=1, le=1000)),
    offset=(int, Field(0, ge=0, le=INT8_MAX)),
    with_count=(bool, Field(False, description="also count every matching failure (slower on large stores)")),
)

SummaryQuery = create_model(
    "SummaryQuery",
    __base__=ResultFilters,
    by=(str, Field(..., description=f"one or two comma-separated fields of: {', '.join(GROUPABLE)}")),
)


class SummaryGroup(BaseModel):
    key: dict[str, Any]
    runs: int = Field(description="finished configs in the group")
    failures: int = Field(description="fail + nan + error + timeout + oom")
    failure_rate: float | None = Field(description="failures / (runs - not_applicable); null when nothing ran")
    outcomes: dict[str, int]


class FailureSummary(BaseModel):
    by: list[str]
    runs: int
    failures: int
    failure_rate: float | None
    groups: list[SummaryGroup]
