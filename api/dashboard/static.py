"""The dashboard's scripts and styles, and plotly.js as the plotly package ships it (no CDN).

Files come from a fixed list of names, never from a path in the request. plotly.min.js is
about 5 MB, so a browser that accepts gzip gets it compressed (about 1.4 MB), compressed once.
"""
from __future__ import annotations

import gzip
from functools import lru_cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response, status

HERE = Path(__file__).parent / "static"
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


@lru_cache(maxsize=1)
def _files() -> dict[str, Path]:
    plotly_js = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    return {**{p.name: p for p in HERE.iterdir() if p.suffix in TYPES}, plotly_js.name: plotly_js}


@lru_cache(maxsize=16)
def _gzipped(path: Path) -> bytes:
    return gzip.compress(path.read_bytes(), compresslevel=6, mtime=0)


router = APIRouter(prefix="/dashboard/static", include_in_schema=False)


@router.get("/{name}")
def read_static(name: str, request: Request) -> Response:
    path = _files().get(name)
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no static file {name!r}")
    headers = {"Cache-Control": "public, max-age=3600", "Vary": "Accept-Encoding"}
    media_type = TYPES[path.suffix]
    if path.stat().st_size > 256 << 10 and "gzip" in request.headers.get("accept-encoding", ""):
        return Response(_gzipped(path), media_type=media_type, headers={**headers, "Content-Encoding": "gzip"})
    return Response(path.read_bytes(), media_type=media_type, headers=headers)
