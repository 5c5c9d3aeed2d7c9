"""/docs (Swagger UI) and /redoc from bundles the service ships, not from a CDN.

FastAPI's default pages load Swagger UI and ReDoc from jsdelivr and fonts from Google, so they
stay blank on a network without the internet (a GPU lab, an air-gapped CI runner). This is
FastAPI's self-hosting recipe with the bundles of the fastapi-offline package (MIT; Swagger
UI is Apache-2.0, ReDoc MIT), served under /docs-assets.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def bundle_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


def install_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc from local assets; the app must be made with docs_url=None, redoc_url=None."""
    app.mount(ASSETS, StaticFiles(directory=bundle_dir()), name="docs-assets")
    title = f"{app.title} API"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=title,
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon.png",
                                   # The validator badge would fetch from validator.swagger.io.
                                   swagger_ui_parameters={"validatorUrl": None})

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=title, redoc_js_url=f"{ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS}/favicon.png", with_google_fonts=False)
