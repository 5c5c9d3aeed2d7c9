"""Who may do what: bearer tokens with scopes, closed by default.

Every token of ATTNSWEEP_API_TOKENS has a name and a scope (settings.ApiToken): `read` reads,
`submit` also submits sweeps and bisections and cancels its own sweeps, `admin` also cancels
anyone's. Writes always need a token of their scope; reads need one of scope `read` when
ATTNSWEEP_READ_AUTH is on. /healthz, the dashboard's page shells (they hold no results: their
scripts read the API with the token the user gives them), the API's docs and its OpenAPI stay
open. ATTNSWEEP_AUTH=off opens everything (a laptop); the API says so at start and on every
dashboard page.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Callable

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.security import check_write
from settings import SCOPES, Settings

bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <secret>` of a token of ATTNSWEEP_API_TOKENS "
                                                  "(scope read, submit or admin)")
# Paths readable without a token whatever ATTNSWEEP_READ_AUTH says.
OPEN_PATHS = ("/healthz", "/docs", "/redoc", "/openapi.json")
# The dashboard's pages and their scripts (not its data endpoints, which live under /sweeps, /ci).
OPEN_PREFIXES = ("/dashboard", "/docs/", "/docs-assets/")

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


@dataclass(frozen=True)
class Caller:
    """Whoever made the request: a token's name and scopes; `name` None when auth is off."""

    name: str | None
    scopes: frozenset[str]

    def may(self, scope: str) -> bool:
        return scope in self.scopes


ANYONE = Caller(None, frozenset(SCOPES))


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def caller_of(settings: Settings, credentials: HTTPAuthorizationCredentials | None, scope: str) -> Caller:
    """The caller allowed `scope`: 401 without a token, 403 with one that is unknown or lacks it."""
    if settings.auth == "off":
        return ANYONE
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, f"a bearer token of scope {scope} is required",
                            headers={"WWW-Authenticate": "Bearer"})
    given = credentials.credentials.encode()
    found = None
    for token in settings.tokens:   # every one compared, in constant time each
        if hmac.compare_digest(given, token.secret.encode()):
            found = token
    if found is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "the bearer token is not valid")
    if scope not in found.scopes:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"the token {found.name!r} has scope {found.scope}; this needs scope {scope}")
    return Caller(found.name, found.scopes)


def writer(scope: str) -> Callable[..., Caller]:
    """A write route's dependency: the caller allowed `scope`, then the rules of every write
    (api/security.py: JSON, from this site). A coroutine, as read_access: it only compares."""
    async def dependency(request: Request, credentials: Credentials) -> Caller:
        caller = caller_of(_settings(request), credentials, scope)
        check_write(request)
        return caller

    dependency.__name__ = f"writer_{scope}"
    return dependency


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


async def read_access(request: Request, credentials: Credentials) -> None:
    """Every route's dependency: a read needs scope `read` where ATTNSWEEP_READ_AUTH is on. A
    coroutine (api/deps.py says why): it compares tokens and reads nothing else."""
    settings = _settings(request)
    if settings.auth == "off" or not settings.read_auth or request.method not in ("GET", "HEAD"):
        return
    if not is_open(request.url.path):
        caller_of(settings, credentials, "read")


Submitter = Annotated[Caller, Depends(writer("submit"))]
# A write that carries no token (the CI webhook: its body is signed instead).
UnsignedWrite = Annotated[None, Depends(check_write)]
