"""What every answer carries and what every write must be, whoever the caller is.

- Every response carries a strict Content-Security-Policy (scripts only from this origin, none
  inline: the dashboard passes its data in a JSON block), `X-Content-Type-Options: nosniff`,
  `X-Frame-Options: DENY` and `frame-ancestors 'none'` (no page of ours inside another site's
  frame), and sends no Referer off the site.
- A state-changing request must be `Content-Type: application/json`: a cross-site HTML form can
  only send form encodings or text/plain, and a script on another origin cannot send JSON
  without a CORS preflight, which this API answers with no CORS headers. Where the browser says
  where a request comes from (`Origin`, `Sec-Fetch-Site`), a write from another site is refused
  even so. Every write route checks it (`check_write`, through api/auth.py's dependencies),
  after the caller's token: a write without a token is a 401 whatever it sends.
"""
from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import urlsplit

from fastapi import Request

from api.errors import ProblemError

CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin")]
JSON_TYPES = ("application/json",)


def _origin(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else None


def write_problem(headers: Mapping[str, str], public_url: str) -> tuple[int, str, str] | None:
    """(status, field, rule) refusing a write that comes from another site or is not JSON; None: fine."""
    origin = headers.get("origin", "").strip()
    if origin:
        host = headers.get("host", "").strip().lower()
        allowed = {_origin(public_url)} if public_url else set()
        # The scheme is not compared with the request's own: behind a TLS proxy the API sees http.
        same_host = origin != "null" and urlsplit(origin).netloc.lower() == host
        if not same_host and origin.lower() not in allowed:
            return 403, "Origin", (f"Origin {origin} is another site: writes come from this API's own pages or from "
                                   "clients that send no Origin (ATTNSWEEP_PUBLIC_URL names the dashboard's address)")
    if headers.get("sec-fetch-site", "").strip() == "cross-site":
        return 403, "Sec-Fetch-Site", "a write from another site (Sec-Fetch-Site: cross-site) is refused"
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind not in JSON_TYPES:
        return 415, "Content-Type", (f"Content-Type {kind or 'none'}: a write must be application/json (a body of {{}} "
                                     "when it has nothing to say)")
    return None


def check_write(request: Request) -> None:
    """Raise the refusal of write_problem (a 403 or 415 naming the header and the rule)."""
    problem = write_problem(request.headers, request.app.state.settings.public_url)
    if problem is not None:
        code, field, rule = problem
        raise ProblemError([(field, rule)], status_code=code)


class SecurityHeaders:
    """ASGI middleware: the module docstring's headers on every response."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in HEADERS if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)
