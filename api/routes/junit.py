"""GET /sweeps/{id}/junit.xml: a sweep as JUnit XML (ci.junit), for CI systems to display."""
from __future__ import annotations

from fastapi import APIRouter, Response

from api.deps import SweepId, SessionDep, sweep_or_404
from api.schemas.common import Message
from ci import junit
from ci.status import junit_bugs
from store.ci import base_sweep, failing_hashes
from store.sweeps import runs_in_order

router = APIRouter(tags=["ci"])


@router.get("/sweeps/{sweep_id}/junit.xml", response_class=Response,
            responses={200: {"content": {"application/xml": {}}}, 404: {"model": Message}})
def read_sweep_junit(sweep_id: SweepId, session: SessionDep) -> Response:
    """One test case per config; failures and errors carry their metrics, gates and reproducer.
    In a pull request's report, failures already known on the base branch say so. Once the
    sweep is triaged, failures are reported by bug (properties attnsweep.summary and
    attnsweep.bug.N; each failure's message names its bug)."""
    sweep = sweep_or_404(session, sweep_id)
    base = base_sweep(session, sweep)
    known = failing_hashes(session, base.id) if base is not None else set()
    runs = runs_in_order(session, sweep_id)
    bugs, summary = junit_bugs(session, sweep)
    body = junit.render(sweep, runs, known=known, base_sweep_id=base.id if base is not None else None, bugs=bugs,
                        summary=summary)
    return Response(body, media_type="application/xml")
