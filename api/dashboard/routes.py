"""The dashboard's pages: HTML shells whose small scripts read the public query endpoints.

Nothing here queries the store: the pages fetch GET /sweeps, /sweeps/{id}, /sweeps/{id}/failures,
/sweeps/{id}/failure-rates, /ci/commits, /workers and /metrics like any external dashboard. The server only fills
in the lists of fields the endpoints accept, so the pages offer exactly what the API takes.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from api.deps import SweepId
from api.dashboard import static
from api.routes import analysis
from api.schemas.analysis import SweepFailuresQuery
from attnconfig.outcomes import FAILING_OUTCOMES, OUTCOMES
from store.analysis import RATE_FIELDS
from store.queries import SORTABLE

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")

NOT_FILTERS = ("sort", "limit", "offset", "label", "since", "until")
# Offered first in the filter and heatmap menus: docs/spec.md §1's config fields, then the rest.
CONFIG_FIRST = ("dtype", "data_regime", "split_kv", "causal", "gqa_ratio", "seq_len_k", "seq_len_q", "head_dim_qk", "head_dim_v", "g",
                "num_heads_q", "num_heads_kv", "kv_cache", "has_prefix_offset", "with_attn_bias", "with_attn_scale",
                "return_lse", "trans_q", "trans_k", "trans_v", "trans_o", "data_seed")


def _first(names: list[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(CONFIG_FIRST)}
    return sorted(names, key=lambda n: (rank.get(n.removesuffix("_bucket"), len(rank)), n))


def _filters() -> list[dict[str, str]]:
    fields = SweepFailuresQuery.model_fields
    names = _first([n for n in fields if n not in NOT_FILTERS])
    return [{"name": n, "hint": fields[n].description or ("true or false" if fields[n].annotation == (bool | None) else "")}
            for n in names]


router = APIRouter()
router.include_router(analysis.router)
router.include_router(static.router)
pages = APIRouter(prefix="/dashboard", include_in_schema=False, default_response_class=HTMLResponse)


@pages.get("")
def read_sweeps_page(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "sweeps.html", {
        "page": "sweeps", "page_data": {"outcomes": list(OUTCOMES), "failing": list(FAILING_OUTCOMES)}})


@pages.get("/sweeps/{sweep_id}")
def read_sweep_page(request: Request, sweep_id: SweepId) -> HTMLResponse:
    context = {
        "page": "sweep", "sweep_id": sweep_id,
        "page_data": {"sweep_id": sweep_id, "outcomes": list(OUTCOMES), "failing": list(FAILING_OUTCOMES)},
        "filters": _filters(), "rate_fields": _first(list(RATE_FIELDS)), "sortable": SORTABLE,
    }
    return templates.TemplateResponse(request, "sweep.html", context)


@pages.get("/ci")
def read_ci_page(request: Request, repository: str = "") -> HTMLResponse:
    return templates.TemplateResponse(request, "ci.html", {"page": "ci", "repository": repository})


@pages.get("/compare")
def read_compare_page(request: Request, sweeps: str = "") -> HTMLResponse:
    """Sweeps of several kernels side by side (GET /compare)."""
    return templates.TemplateResponse(request, "compare.html", {
        "page": "compare", "sweeps": sweeps[:200], "page_data": {"outcomes": list(OUTCOMES)}})


@pages.get("/workers")
def read_workers_page(request: Request) -> HTMLResponse:
    """Workers and queues: what GET /workers and GET /metrics know."""
    return templates.TemplateResponse(request, "workers.html", {"page": "workers"})


@pages.get("/sweeps", response_class=RedirectResponse)
def redirect_sweeps() -> RedirectResponse:
    return RedirectResponse("/dashboard")


router.include_router(pages)
