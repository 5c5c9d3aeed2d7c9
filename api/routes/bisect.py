"""Bisections: ask for the first bad commit of a kernel repository, read the answer. A worker
runs each one (workers/bisect.py); the API only stores and reads them."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Response, status

from api.auth import Submitter
from api.deps import CeleryDep, SessionDep, SettingsDep
from api.errors import ProblemError
from api.schemas.bisect import BisectCreate, BisectionAccepted, BisectionPublic
from api.schemas.common import Message, Problems
from attnconfig.config import INT4_MAX
from kernelsrc.trust import repository_problem
from store.bisections import bisection_public
from store.models import Bisection
from submit.bisect import submit_bisection

router = APIRouter(prefix="/bisect", tags=["bisect"])

BisectionId = Annotated[int, Path(ge=1, le=INT4_MAX, description="the bisection's id")]


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=BisectionAccepted,
             responses={401: {"model": Message}, 403: {"model": Message}, 413: {"model": Problems},
                        422: {"model": Problems}})
def create_bisection(body: BisectCreate, session: SessionDep, celery: CeleryDep, settings: SettingsDep,
                     caller: Submitter, response: Response) -> BisectionAccepted:
    """Store a bisection and queue it for a worker of its backend's queue.

    The worker walks `repo`'s first-parent history from `good` to `bad` (both ends checked
    first: `good` must pass and `bad` fail), reading each commit's kernels/src and running the
    configs on it. Poll GET /bisect/{id} until `status` is done (or error). `repo` must be one the
    deployment trusts (ATTNSWEEP_KERNEL_REPO, ATTNSWEEP_KERNEL_REPOSITORIES), without credentials."""
    problem = repository_problem(body.repo, settings)
    if problem is not None:
        raise ProblemError([("repo", problem)])
    accepted = submit_bisection(session, celery, settings, repo=body.repo, good=body.good, bad=body.bad,
                                configs=[c.to_dict() for c in body.configs], backend=body.backend,
                                defects=list(body.defects), err_ratio_gate=body.err_ratio_gate,
                                submitted_by=caller.name)
    url = f"/bisect/{accepted.id}"
    response.headers["Location"] = url
    return BisectionAccepted(id=accepted.id, status=accepted.status, queue=accepted.queue, published=accepted.published,
                             url=url)


@router.get("/{bisection_id}", response_model=BisectionPublic, responses={404: {"model": Message}})
def read_bisection(bisection_id: BisectionId, session: SessionDep, settings: SettingsDep) -> BisectionPublic:
    """A bisection: queued, running (the commits tested so far), done with the first bad commit,
    or error with the reason."""
    row = session.get(Bisection, bisection_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"bisection {bisection_id} not found")
    body = bisection_public(row)
    # A CI push's bisection stores ATTNSWEEP_KERNEL_REPO as it is set, credentials included.
    body["repo"], body["error"] = settings.scrub(body["repo"]), body["error"] and settings.scrub(body["error"])
    return BisectionPublic.model_validate(body)
