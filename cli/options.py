"""Turn the CLI's strings into a SweepSpec (the same model the REST API validates)."""
from __future__ import annotations

from typing import Any

from sweeps.spec import SweepSpec, parse_ranges, parse_sweep_spec


def build_spec(*, dtypes: str, ranges: list[str], **fields: Any) -> SweepSpec:
    names = [d.strip() for d in dtypes.split(",") if d.strip()]
    return parse_sweep_spec({"dtypes": names, "ranges": parse_ranges(ranges), **fields})
