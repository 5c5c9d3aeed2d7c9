"""CI reads: a commit's state and verdict, the list of CI sweeps, and (api.routes.junit) the
JUnit report of a sweep."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from api.convert import utc
from api.deps import SessionDep
from api.routes import junit
from api.schemas.ci import SHA_PATTERN, CiCommit, CiCommitsQuery, CiRepository, CiStatus, CiStatusQuery
from api.schemas.common import Message, Problems
from ci.status import commit_status
from store.ci import ci_repositories, ci_sweeps, sweep_for_commit

router = APIRouter(tags=["ci"])
router.include_router(junit.router)


@router.get("/ci/commits", response_model=list[CiCommit], responses={422: {"model": Problems}})
def read_ci_commits(query: Annotated[CiCommitsQuery, Query()], session: SessionDep) -> list[CiCommit]:
    """CI sweeps of a repository, newest first, each with its state, verdict and failure counts."""
    out = []
    for sweep in ci_sweeps(session, query.repository, query.limit, query.offset):
        st = commit_status(session, sweep, with_failures=False)
        out.append(CiCommit(commit_sha=st["commit_sha"], ref=st["ref"], event=st["event"], sweep_id=sweep.id,
                            state=st["state"], verdict=st["verdict"], configs=st["configs"], failures=st["failures"],
                            failure_rate=st["failure_rate"], finished_at=utc(st["finished_at"])))
    return out


@router.get("/ci/repositories", response_model=list[CiRepository])
def read_ci_repositories(session: SessionDep) -> list[CiRepository]:
    """Every repository that sent CI events, by name, with its newest CI sweep and that sweep's verdict."""
    out = []
    for name, n, newest in ci_repositories(session):
        st = commit_status(session, newest, with_failures=False)
        out.append(CiRepository(repository=name, sweeps=n, last_sweep_id=newest.id, last_commit_sha=newest.commit_sha,
                                last_ref=newest.ref, last_verdict=st["verdict"], last_created_at=utc(newest.created_at)))
    return out


@router.get("/ci/{sha}", response_model=CiStatus, responses={404: {"model": Message}, 422: {"model": Problems}})
def read_ci_commit(sha: Annotated[str, Path(pattern=SHA_PATTERN, description="full commit id")],
                   query: Annotated[CiStatusQuery, Query()], session: SessionDep) -> CiStatus:
    """State and verdict of the commit's CI sweep: pending, pass, fail or error, with the failures
    that fail the check (new) and, for a pull request, those known on the base branch."""
    sweep = sweep_for_commit(session, sha, repository=query.repository, event=query.event)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no CI sweep of commit {sha}")
    st = commit_status(session, sweep)
    st.update(created_at=utc(st["created_at"]), finished_at=utc(st["finished_at"]), junit_url=f"/sweeps/{sweep.id}/junit.xml")
    return CiStatus(**st)
