"""Sweeps: submit, list, read, page through results, cancel, re-run."""
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Response, status

from api.convert import config_run_public, sweep_public
from api.auth import Submitter
from api.deps import SweepId, Offset, CeleryDep, SessionDep, sweep_or_404, SettingsDep, TelemetryDep
from api.schemas.clusters import ClustersPublic
from api.schemas.common import Message, Problems, jsonable
from api.schemas.sweeps import (
    ConfigRunsPublic,
    SweepAccepted,
    SweepCreate,
    SweepPublic,
    SweepCancel,
    SweepRerun,
    SweepsPublic,
    SweepStatus,
)
from api.submission import submit_sweep
from attnconfig import parse_config
from attnconfig.outcomes import OUTCOMES
from store import queries, repo
from store.clusters import bug_counts, clusters_report
from store.models import Sweep
from store.queries import Match, ResultFilter
from sweeps.spec import SweepSpec

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

WRITE_ERRORS = {401: {"model": Message}, 403: {"model": Message}, 413: {"model": Problems}, 422: {"model": Problems}}
NOT_FOUND = {404: {"model": Message}}


def _public(session: SessionDep, sweep: Sweep) -> SweepPublic:
    return sweep_public(sweep, queries.sweeps_counts(session, [sweep.id])[sweep.id],
                        bug_counts(session, [sweep.id]).get(sweep.id))


IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", description="a key of the client's choosing (a UUID): a retried request with the same key "
                                         "gets the first one's sweep (200) instead of a new sweep")]


def _accepted(telemetry: TelemetryDep, response: Response, accepted: SweepAccepted) -> SweepAccepted:
    response.headers["Location"] = f"/sweeps/{accepted.id}"
    if accepted.replayed:
        response.status_code = status.HTTP_200_OK
        return accepted
    telemetry.sweeps_submitted.inc()
    if accepted.published:
        telemetry.configs_enqueued.inc(accepted.configs_total)
    return accepted


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=SweepAccepted,
             responses={200: {"model": SweepAccepted}, **WRITE_ERRORS, 503: {"model": Message}})
def create_sweep(body: SweepCreate, session: SessionDep, celery: CeleryDep, settings: SettingsDep,
                 telemetry: TelemetryDep, caller: Submitter, response: Response,
                 idempotency_key: IdempotencyKey = None) -> SweepAccepted:
    """Sample and prefilter now, store the sweep, and queue its configs for the workers.

    The sweep is committed before anything is published; if the broker does not take the
    configs now (`published: false`), the reconciler publishes them once it can. With an
    `Idempotency-Key`, a retried request answers 200 with the sweep the first one made.

    With `configs`, those configs are run as given (a regression set) instead of sampling.
    The split-KV budget is the request's `splitkv_extra_bytes_limit`, else the smallest
    device memory the target queue's live workers reported, else 1.5 GiB.
    """
    return _accepted(telemetry, response, submit_sweep(session, celery, settings, body, idempotency_key=idempotency_key,
                                                                submitted_by=caller.name))


@router.get("", response_model=SweepsPublic)
def read_sweeps(session: SessionDep, status_: Annotated[SweepStatus | None, Query(alias="status")] = None,
                label: str | None = None, offset: Offset = 0,
                limit: Annotated[int, Query(ge=1, le=500)] = 50) -> SweepsPublic:
    """Sweeps, newest first."""
    rows, count = queries.list_sweeps(session, status=status_, label=label, offset=offset, limit=limit)
    counts = queries.sweeps_counts(session, [s.id for s in rows])
    bugs = bug_counts(session, [s.id for s in rows])
    return SweepsPublic(data=[sweep_public(s, counts[s.id], bugs.get(s.id)) for s in rows], count=count)


@router.get("/{sweep_id}", response_model=SweepPublic, responses=NOT_FOUND)
def read_sweep(sweep_id: SweepId, session: SessionDep) -> SweepPublic:
    """A sweep with docs/spec.md §8's counts: configs_total, configs_done, outcomes, filtered, ..."""
    return _public(session, sweep_or_404(session, sweep_id))


@router.get("/{sweep_id}/results", response_model=ConfigRunsPublic, responses=NOT_FOUND)
def read_sweep_results(sweep_id: SweepId, session: SessionDep,
                       outcome: Annotated[Literal[OUTCOMES] | None, Query()] = None,  # type: ignore[valid-type]
                       state: Literal["queued", "done", "cancelled"] | None = None,
                       offset: Offset = 0,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> ConfigRunsPublic:
    """Every config of the sweep in sampled order, with its result once run."""
    sweep_or_404(session, sweep_id)
    matches = {}
    if outcome is not None:
        matches["outcome"] = Match(values=(outcome,))
    if state is not None:
        matches["state"] = Match(values=(state,))
    page = queries.sweep_results(session, sweep_id, ResultFilter(matches=matches), offset=offset, limit=limit)
    return ConfigRunsPublic(data=[config_run_public(r, label) for r, label in page.rows], count=page.count,
                            has_more=page.has_more)


@router.get("/{sweep_id}/clusters", response_model=ClustersPublic, responses=NOT_FOUND)
def read_sweep_clusters(sweep_id: SweepId, session: SessionDep) -> ClustersPublic:
    """The sweep's failures grouped by bug: per cluster its size, explanation, minimal reproducer,
    classification and first bad commit. Workers compute them after the sweep ends; until then
    `status` is pending (or running)."""
    sweep_or_404(session, sweep_id)
    return ClustersPublic.model_validate(jsonable(clusters_report(session, sweep_id)))


@router.post("/{sweep_id}/cancel", response_model=SweepPublic, responses={**NOT_FOUND, 409: {"model": Message}, **WRITE_ERRORS})
def cancel_sweep(sweep_id: SweepId, session: SessionDep, caller: Submitter, _body: SweepCancel) -> SweepPublic:
    """Stop a queued or running sweep: its configs not yet started are skipped by the workers. A
    token of scope submit cancels the sweeps it submitted; an admin token any sweep."""
    sweep = sweep_or_404(session, sweep_id)
    if not caller.may("admin") and sweep.submitted_by != caller.name:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"sweep {sweep_id} was not submitted by the token {caller.name!r}: "
                                                       "only its own token or one of scope admin may cancel it")
    if sweep.status not in repo.ACTIVE_STATUSES:
        raise HTTPException(status.HTTP_409_CONFLICT, f"sweep {sweep_id} is {sweep.status}; only a queued or running sweep can be cancelled")
    repo.cancel_sweep(session, sweep_id)
    session.commit()
    session.refresh(sweep)
    return _public(session, sweep)


@router.post("/{sweep_id}/rerun", status_code=status.HTTP_202_ACCEPTED, response_model=SweepAccepted,
             responses={200: {"model": SweepAccepted}, **NOT_FOUND, 409: {"model": Message}, **WRITE_ERRORS, 503: {"model": Message}})
def rerun_sweep(sweep_id: SweepId, session: SessionDep, celery: CeleryDep, settings: SettingsDep, telemetry: TelemetryDep,
                caller: Submitter, response: Response, body: SweepRerun,
                idempotency_key: IdempotencyKey = None) -> SweepAccepted:
    """A new sweep of the same configs (or of its failures only), same backend, gates and defects."""
    original = sweep_or_404(session, sweep_id)
    stored = queries.sweep_configs(session, sweep_id, failures_only=body.failures_only)
    if not stored:
        what = "failures" if body.failures_only else "configs"
        raise HTTPException(status.HTTP_409_CONFLICT, f"sweep {sweep_id} has no {what} to re-run")
    request = {k: v for k, v in original.request.items() if k in SweepSpec.model_fields}
    request["label"] = body.label if body.label is not None else original.label
    request.pop("samples", None)
    create = SweepCreate.model_validate({**request, "defects": original.request.get("defects", [])})
    configs = [parse_config(c) for c in stored]
    accepted = submit_sweep(session, celery, settings, create, configs=configs, rerun_of=sweep_id,
                            extra_request={"rerun_of": sweep_id, "failures_only": body.failures_only},
                            idempotency_key=idempotency_key, submitted_by=caller.name)
    return _accepted(telemetry, response, accepted)
