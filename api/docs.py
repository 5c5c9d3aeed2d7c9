"""/docs (Swagger UI) and /redoc from bundles the service ships, not from a CDN.

FastAPI's default pages load Swagger UI and ReDoc from jsdelivr and fonts from Google, so they
stay blank on a network without the internet (a GPU lab, an air-gapped CI runner), and they start
Swagger UI from an inline script, which the API's Content-Security-Policy (api/security.py)
refuses. These pages load the bundles of the fastapi-offline package (MIT; Swagger UI is
Apache-2.0, ReDoc MIT) from /docs-assets and start Swagger UI from /docs/init.js.
"""
from __future__ import annotations

from functools import lru_cache
from html import escape
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"

SWAGGER_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css"><link rel="icon" href="{assets}/favicon.png">
</head><body><div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script><script src="/docs/init.js"></script>
</body></html>"""

# The validator badge would fetch from validator.swagger.io.
SWAGGER_INIT = """"use strict";
window.ui = SwaggerUIBundle({
  url: %s, dom_id: "#swagger-ui", layout: "BaseLayout", deepLinking: true, showExtensions: true,
  showCommonExtensions: true, validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
"""

# ReDoc starts itself from its <redoc> element: no inline script either.
REDOC_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><link rel="icon" href="{assets}/favicon.png">
</head><body><redoc spec-url="{openapi}"></redoc><script src="/docs/redoc.js"></script>
</body></html>"""


# ReDoc's bundle shows Redocly's logo from their CDN in its sidebar; served here it shows none
# (an empty image), so the page loads nothing from outside and breaks no img-src rule.
REDOC_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"


@lru_cache(maxsize=1)
def redoc_bundle() -> bytes:
    return (bundle_dir() / "redoc.standalone.js").read_bytes().replace(REDOC_LOGO, EMPTY_IMAGE)


def bundle_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


def install_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc from local assets; the app must be made with docs_url=None, redoc_url=None."""
    import json

    app.mount(ASSETS, StaticFiles(directory=bundle_dir()), name="docs-assets")
    title = escape(f"{app.title} API")
    openapi = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return HTMLResponse(SWAGGER_PAGE.format(title=title, assets=ASSETS))

    @app.get("/docs/init.js", include_in_schema=False)
    def swagger_init() -> Response:
        return Response(SWAGGER_INIT % json.dumps(openapi), media_type="text/javascript; charset=utf-8")

    @app.get("/docs/redoc.js", include_in_schema=False)
    def redoc_script() -> Response:
        return Response(redoc_bundle(), media_type="text/javascript; charset=utf-8",
                        headers={"Cache-Control": "public, max-age=3600"})

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return HTMLResponse(REDOC_PAGE.format(title=title, assets=ASSETS, openapi=escape(openapi)))
