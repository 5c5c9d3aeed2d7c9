"""Errors as bodies: every 4xx names the field and the rule; bodies over the limit are a 413.

422 body: {"detail": [{"field": "configs.3.num_heads_q", "rule": "num_heads_q=6 is not a
multiple of num_heads_kv=4"}, ...]}. Fields are dotted paths into the JSON body, or the name
of the query parameter.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas.common import jsonable
from attnconfig import ConfigError
from store.db import DatabaseError, is_unreachable

# Seconds a client is told to wait when the database cannot be reached (Retry-After).
RETRY_AFTER_S = 5

log = logging.getLogger(__name__)
LOCATIONS = ("body", "query", "path", "header", "cookie")


class SafeJSONResponse(JSONResponse):
    """JSON whatever the floats: NaN and +-inf are written as "nan", "inf", "-inf"."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(jsonable(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        try:
            return text.encode()
        except UnicodeEncodeError:  # a lone surrogate echoed from a request: escaped, still JSON
            return json.dumps(jsonable(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


class ProblemError(Exception):
    """A request broke rules that only the handler can check; `problems` are (field, rule) pairs."""

    def __init__(self, problems: list[tuple[str, str]], status_code: int = 422):
        self.problems = problems
        self.status_code = status_code
        super().__init__("; ".join(f"{f}: {r}" for f, r in problems))


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return ""
    text = repr(value)
    return (text[:77] + "...") if len(text) > 80 else text


def _qualified(prefix: str, field: str) -> str:
    """configs.1 + num_heads_q -> configs.1.num_heads_q; ranges + ranges.g stays ranges.g."""
    if not prefix or field == prefix or field.startswith(prefix + "."):
        return field
    return f"{prefix}.{field}"


def request_problems(errors: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """FastAPI/pydantic errors as (field, rule), unwrapping the config model's own ConfigErrors."""
    problems: list[tuple[str, str]] = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] in LOCATIONS:
            loc = loc[1:]
        prefix = ".".join(loc)
        if err.get("type") == "json_invalid":
            problems.append(("body", f"not valid JSON: {(err.get('ctx') or {}).get('error', err.get('msg'))}"))
            continue
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, ValueError) and inner.args and isinstance(inner.args[0], ConfigError):
            problems.extend((_qualified(prefix, f), r) for f, r in inner.args[0].problems)
            continue
        field = prefix or "body"
        shown = _shown(err.get("input"))
        problems.append((field, f"{field}={shown}: {err['msg']}" if shown else err["msg"]))
    return problems


def problems_body(problems: list[tuple[str, str]]) -> dict[str, Any]:
    return {"detail": [{"field": f, "rule": r} for f, r in problems]}


def _scrubbed(request: Request, problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    scrub = request.app.state.settings.scrub
    return [(scrub(f), scrub(r)) for f, r in problems]


def install_error_handlers(app: FastAPI) -> None:
    """Every error body goes through the settings' scrub (settings/secrets.py): a message may quote
    a URL with its credentials (git's, a driver's) or echo a secret a client sent."""
    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return SafeJSONResponse(problems_body(_scrubbed(request, request_problems(exc.errors()))), status_code=422)

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return SafeJSONResponse(problems_body(_scrubbed(request, exc.problems)), status_code=exc.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = request.app.state.settings.scrub(exc.detail) if isinstance(exc.detail, str) else exc.detail
        return SafeJSONResponse({"detail": detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(DatabaseError)
    async def _database(_request: Request, exc: DatabaseError) -> JSONResponse:
        # The database is down or unreachable: 503 and when to try again, not a 500. Any other
        # database error is a bug and stays a 500.
        if not is_unreachable(exc):
            raise exc
        log.warning("database unreachable: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return database_unavailable()


def database_unavailable() -> JSONResponse:
    return SafeJSONResponse({"detail": "the database cannot be reached; try again later"},
                            status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


# JSON nested deeper than this is refused (422) before it is parsed: Python's parser recurses per
# level and a body of 100,000 brackets would end in RecursionError. No request this API takes
# (a sweep, a bisection, a code host's event) nests a tenth as deep.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings not counted)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    for c in brackets:
        depth += 1 if c in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def json_problem(body: bytes) -> str | None:
    """Why a JSON body is refused before it is parsed: not UTF-8 (RFC 8259's encoding of JSON
    between systems), or nested deeper than MAX_JSON_DEPTH. None: the parser may have it."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid JSON: not UTF-8 text (byte {exc.start} is 0x{body[exc.start]:02x})"
    if json_depth(body) > MAX_JSON_DEPTH:
        return f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects"
    return None


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is refused with 413 before any handler runs,
    and a JSON body nested deeper than MAX_JSON_DEPTH with 422.

    The body is read here (declared length first, then the bytes really sent) and replayed to
    the application, so a chunked upload cannot slip past the limit either.
    """

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        kind = dict(scope.get("headers") or []).get(b"content-type", b"")
        problem = json_problem(body) if b"json" in kind.lower() else None
        if problem is not None:
            await SafeJSONResponse(problems_body([("body", problem)]), status_code=422)(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        body = problems_body([("body", f"the request body exceeds the limit of {self.max_bytes} bytes (ATTNSWEEP_MAX_BODY_BYTES)")])
        await SafeJSONResponse(body, status_code=413)(scope, receive, send)
