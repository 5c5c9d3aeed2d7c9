"""Failures across sweeps: filtered, sorted and paged; and grouped counts with failure rates."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.convert import config_run_public
from api.deps import SessionDep
from api.filters import parse_by, parse_sort, result_filter
from api.schemas.common import Problems
from api.schemas.failures import FailureQuery, FailureSummary, SummaryGroup, SummaryQuery
from api.schemas.sweeps import ConfigRunsPublic
from store import queries

router = APIRouter(prefix="/failures", tags=["failures"])


@router.get("", response_model=ConfigRunsPublic, responses={422: {"model": Problems}})
def read_failures(query: Annotated[FailureQuery, Query()], session: SessionDep) -> ConfigRunsPublic:  # type: ignore[valid-type]
    """Failed configs (fail, nan, fault, unsafe, error, timeout, oom), newest first; each with its reproducer."""
    flt = result_filter(query, failures_only=True)
    page = queries.failures(session, flt, sort=parse_sort(query.sort), offset=query.offset, limit=query.limit,
                            with_count=query.with_count)
    return ConfigRunsPublic(data=[config_run_public(r, label) for r, label in page.rows], count=page.count,
                            has_more=page.has_more)


@router.get("/summary", response_model=FailureSummary, responses={422: {"model": Problems}})
def read_failure_summary(query: Annotated[SummaryQuery, Query()], session: SessionDep) -> FailureSummary:  # type: ignore[valid-type]
    """Outcome counts and failure rates of finished configs, grouped by one or two fields (`by=dtype,split_kv`)."""
    by = parse_by(query.by)
    groups = queries.failure_summary(session, by, result_filter(query, failures_only=False))
    return FailureSummary(by=by, **queries.group_totals(groups), groups=[SummaryGroup(**g) for g in groups])
