"""Turn the CLI's strings into a SweepSpec (the same model the REST API validates)."""
from __future__ import annotations

from typing import Any

from sweeps.spec import SweepSpec, parse_range


def build_spec(*, dtypes: str, ranges: list[str], **fields: Any) -> SweepSpec:
    parsed = dict(parse_range(r) for r in ranges)
    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    return SweepSpec(dtypes=names, ranges=parsed, **fields)
