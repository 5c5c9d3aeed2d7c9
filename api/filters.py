"""Query parameters of the result endpoints to store filters (store.queries.ResultFilter).

Integer fields take `N`, `A,B,C` (any of) or `LO:HI` (inclusive, either end open: `1024:`,
`:64`); text fields one value or a comma-separated list; booleans true/false. `gate` is the
failed gate, `sweep` the sweep id.
"""
from __future__ import annotations

import re
from typing import Sequence
from pydantic import BaseModel

from api.errors import ProblemError
from attnconfig.config import INT4_MAX
from attnconfig.outcomes import FAILING_OUTCOMES, GATES, OUTCOMES
from attnconfig.regimes import REGIMES
from store.queries import FIELD_KINDS, GROUPABLE, SORTABLE, Match, ResultFilter, int_bound

_INT_RANGE = re.compile(r"^\s*(-?[0-9]+)?\s*:\s*(-?[0-9]+)?\s*$")
_INT = re.compile(r"^-?[0-9]+$")
ALIASES = {"gate": "failed_gate", "sweep": "sweep_id"}
CHOICES = {"outcome": OUTCOMES, "failed_gate": GATES, "dtype": ("f16", "bf16", "f32", "i8"), "data_regime": REGIMES}
# bug: the sweep failures handler resolves it to its cluster's config hashes.
NOT_FILTERS = {"label", "since", "until", "sort", "limit", "offset", "with_count", "by", "bug"}


def _bounded_int(param: str, text: str, bound: int) -> int:
    text = text.strip()
    if not _INT.match(text) or len(text) > 21 or not -bound - 1 <= int(text) <= bound:
        raise ProblemError([(param, f"{param}={text[:40]!r}: integers must be in [{-bound - 1}, {bound}] "
                                    "(the range the store's column holds)")])
    return int(text)


def parse_int_match(param: str, text: str, bound: int = INT4_MAX) -> Match:
    """N, A,B,C or LO:HI, every integer within [-bound - 1, bound] (what the column holds)."""
    m = _INT_RANGE.match(text)
    if m:
        lo, hi = (_bounded_int(param, g, bound) if g is not None else None for g in m.groups())
        if lo is None and hi is None:
            raise ProblemError([(param, f"{param}={text!r}: a range needs at least one end, e.g. 64:128 or 1024:")])
        if lo is not None and hi is not None and lo > hi:
            raise ProblemError([(param, f"{param}={text!r}: lo must be <= hi")])
        return Match(lo=lo, hi=hi)
    values = [v.strip() for v in text.split(",")]
    if not all(_INT.match(v) for v in values):
        raise ProblemError([(param, f"{param}={text[:80]!r}: expected N, A,B,C or LO:HI with integers")])
    return Match(values=tuple(_bounded_int(param, v, bound) for v in values))


def parse_str_match(param: str, column: str, text: str, allowed: tuple[str, ...] | None = None) -> Match:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise ProblemError([(param, f"{param}={text!r}: give at least one value")])
    allowed = allowed if allowed is not None else CHOICES.get(column)
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ProblemError([(param, f"{param}={bad[0]!r}: must be one of {', '.join(allowed)}")])
    return Match(values=values)


def result_filter(query: BaseModel, *, failures_only: bool) -> ResultFilter:
    """The store filter of a ResultFilters query model; on /failures outcomes must be failing ones."""
    matches: dict[str, Match] = {}
    for param, value in query.model_dump(exclude_none=True).items():
        if param in NOT_FILTERS:
            continue
        column = ALIASES.get(param, param)
        kind = FIELD_KINDS[column]
        if kind == "bool":
            matches[column] = Match(values=(bool(value),))
        elif kind == "int":
            matches[column] = parse_int_match(param, str(value), int_bound(column))
        else:
            allowed = FAILING_OUTCOMES if (column == "outcome" and failures_only) else None
            matches[column] = parse_str_match(param, column, str(value), allowed)
    since, until = getattr(query, "since", None), getattr(query, "until", None)
    if since is not None and until is not None and since >= until:
        raise ProblemError([("until", "until must be after since")])
    return ResultFilter(matches=matches, label=getattr(query, "label", None), since=since, until=until)


def parse_sort(text: str) -> str:
    if text.lstrip("-") not in SORTABLE:
        raise ProblemError([("sort", f"sort={text!r}: must be one of {', '.join(SORTABLE)} (prefix - for descending)")])
    return text


def parse_by(given: str | Sequence[str], allowed: Sequence[str] = GROUPABLE) -> list[str]:
    """One or two distinct fields of `allowed`: `by=a,b`, or repeated `by` parameters."""
    text = given if isinstance(given, str) else ",".join(given)
    by = [b.strip() for b in text.split(",") if b.strip()]
    if not 1 <= len(by) <= 2:
        raise ProblemError([("by", f"by={text!r}: give one or two fields, comma-separated or as repeated by parameters")])
    for b in by:
        if b not in allowed:
            raise ProblemError([("by", f"by={b!r}: must be one of {', '.join(allowed)}")])
    if len(set(by)) != len(by):
        raise ProblemError([("by", f"by={text!r}: the two fields must differ")])
    return by
