"""What a non-passing result is, for grouping: its outcome, the gate that decided it, the kernel family.

Two failures with the same signature are candidates for the same bug. The family is the
kernel path a variant belongs to (rowwise, grouped, mma on the device backends; the `cpu`
emulation is one family), not the variant itself: a variant name carries the dtype and head
dim buckets, and one bug shows in every dtype and head dim its path runs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

NO_FAMILY = "-"  # a result without a variant: it timed out or never reached prepare
PATHS = ("grouped", "mma")  # variant name suffixes (kernels/variants.py Variant.name); none: rowwise


def family_of(variant: str | None) -> str:
    """The kernel path of a variant name: `cpu`, `rowwise`, `grouped` or `mma` (NO_FAMILY for None)."""
    if not variant:
        return NO_FAMILY
    if variant.startswith("cpu_"):
        return "cpu"
    base = variant.split("_defect", 1)[0]
    for path in PATHS:
        if base.endswith("_" + path):
            return path
    return "rowwise"


@dataclass(frozen=True, order=True)
class Signature:
    outcome: str
    gate: str | None
    family: str

    @property
    def failing(self) -> bool:
        return self.outcome not in ("pass", "not_applicable")

    def label(self) -> str:
        return f"{self.outcome}/{self.gate or '-'}/{self.family}"

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)
