"""The error answers the API really sends, written into its OpenAPI.

FastAPI documents every operation's 422 as its own `{loc, msg, type}` list; this API answers
every 4xx it makes itself with `{"detail": [{"field", "rule"}]}` (api/errors.py) or, where one
sentence says it, `{"detail": "..."}`. And three answers come from middleware no route declares:
a write that is not JSON (415) or comes from another site (403, api/security.py), a body over the
size limit (413) or nested too deep (422, api/errors.py); and where reads need a token, 401 and
403 on every read but the open ones (api/auth.py). `document_errors` puts each where it happens.
"""
from __future__ import annotations

from typing import Any

from api.auth import is_open

PROBLEMS = {"$ref": "#/components/schemas/Problems"}
MESSAGE = {"$ref": "#/components/schemas/Message"}
WRITES = ("post", "put", "patch", "delete")
FASTAPI_422 = ("HTTPValidationError", "ValidationError")


def _answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document_errors(schema: dict[str, Any], read_auth: bool) -> dict[str, Any]:
    """Every operation's 4xx as the API sends them, and a read's bearer token only where reads
    need one (`read_auth`) (in place)."""
    either = {"anyOf": [MESSAGE, PROBLEMS]}
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            responses = op["responses"]
            responses["422"] = _answer("the request breaks a rule: each problem names the field and the rule", PROBLEMS)
            if method in WRITES:
                responses.setdefault("401", _answer("no bearer token; a write needs one of scope submit", MESSAGE))
                responses["403"] = _answer("a token that is not valid or lacks the scope, or a write from another "
                                           "site (Origin, Sec-Fetch-Site)", either)
                responses["413"] = _answer("the body is over ATTNSWEEP_MAX_BODY_BYTES", PROBLEMS)
                responses["415"] = _answer("the body is not application/json", PROBLEMS)
            elif read_auth and not is_open(path):
                responses.setdefault("401", _answer("no bearer token (ATTNSWEEP_READ_AUTH: reads need one)", MESSAGE))
                responses.setdefault("403", _answer("the token is not valid", MESSAGE))
            else:
                op.pop("security", None)
    components = schema.get("components", {}).get("schemas", {})
    for name in FASTAPI_422:
        components.pop(name, None)
    return schema
