"""GET /compare and GET /kernels: the kernels this service can sweep, and sweeps of several
kernels side by side (docs/plugins.md). The dashboard's comparison page reads /compare."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from api.deps import SessionDep
from api.errors import ProblemError
from api.schemas.common import Message, Problems
from api.schemas.compare import KernelComparison
from store.kernels import kernel_comparison

router = APIRouter(tags=["kernels"])
MAX_SWEEPS = 12


@router.get("/kernels")
def read_kernels() -> list[dict]:
    """The kernels a sweep's `kernel` may name here: attnsweep's own, the plug-ins that ship, the
    entry points of installed packages (group attnsweep.kernels); `trusted` false: it runs confined."""
    from kernels.plugins import discover

    return discover()


@router.get("/compare", response_model=KernelComparison, responses={404: {"model": Message}, 422: {"model": Problems}})
def read_comparison(sweeps: Annotated[str, Query(description="sweep ids, comma-separated: the same seed and "
                                                             "distribution on several kernels", max_length=200)],
                    session: SessionDep) -> KernelComparison:
    """Outcomes by kernel, not_applicable reasons, kernel time per config as a ratio to the fastest
    kernel that ran it, and the configs that fail on one kernel only."""
    try:
        ids = [int(s) for s in sweeps.split(",") if s.strip()]
    except ValueError:
        raise ProblemError([("sweeps", f"{sweeps!r}: sweep ids, comma-separated, e.g. 3,4")]) from None
    if not 2 <= len(set(ids)) <= MAX_SWEEPS:
        raise ProblemError([("sweeps", f"name 2 to {MAX_SWEEPS} different sweeps")])
    try:
        return KernelComparison(**kernel_comparison(session, ids))
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
