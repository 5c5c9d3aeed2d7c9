"""Shared pieces of the bodies: non-finite metric values and the 422 problem list."""
from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, PlainSerializer, WithJsonSchema

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def finite_or_name(value: Any) -> Any:
    """NaN and +-inf are not JSON: they are written as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def jsonable(obj: Any) -> Any:
    """finite_or_name applied everywhere in a structure of dicts and lists."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return finite_or_name(obj)


# A metric or timing: a number, null where it does not apply, or "nan" / "inf" / "-inf".
Metric = Annotated[
    float | int | None,
    PlainSerializer(finite_or_name, when_used="json"),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string", "enum": list(NON_FINITE)}, {"type": "null"}],
                    "description": 'a number; null where not applicable; "nan", "inf" or "-inf" where non-finite'}),
]


class Problem(BaseModel):
    """One broken rule: the field (dotted path in the body or the query parameter) and the rule."""

    field: str
    rule: str


class Problems(BaseModel):
    """The body of a 422: every problem found, each naming its field and rule."""

    detail: list[Problem]


class Message(BaseModel):
    detail: str
