"""What a non-passing result is, for grouping: its outcome, the gate that decided it, and where
the failure lies.

Two failures with the same signature are candidates for the same bug. The location is the
kernel family that ran the config (rowwise, grouped, mma on the device backends; the `cpu`
emulation is one family), not the variant itself: a variant name carries the dtype and head
dim buckets, and one bug shows in every dtype and head dim its path runs.

One stage is shared by every family: the split-KV combine (attn_splitkv_combine), which every
path launches when split_kv > 1. A failure the evidence places there is located at `combine`
instead of its family, so one combine bug is one group, not one per family:
- `fail` or `nan` of a config with split_kv > 1 whose per-split partials agree with the
  reference's (finite, every bound of the partials gate holding: sweeps.policy.partials_hold)
  while its final output or LSE failed: the splits were right, so what combined them was not
  (the mma decode kernel's fused combine included: the combine stage, in another kernel);
- `fault`, `timeout` or `unsafe` whose detail names the combine kernel and no split kernel (a
  store into O's guard zone when the combine was the one kernel given O, the cpu emulation's
  illegal store or a time limit that stopped its combine, a sanitizer finding in the combine).
Everything else stays at its family: partials that fail (or were not exposed) do not clear the
split kernel, and a GPU's illegal address or hang that no detail attributes is not guessed at.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from attnconfig import AttentionConfig
from kernels.select import COMBINE_KERNEL, SPLIT_KERNEL
from sweeps.policy import partials_hold

NO_FAMILY = "-"  # a result without a variant: it timed out or never reached prepare
COMBINE = "combine"  # the location of a failure of the split-KV combine, whatever the family
PATHS = ("grouped", "mma")  # variant name suffixes (kernels/select.py Variant.name); none: rowwise
NUMERIC_OUTCOMES = ("fail", "nan")
ATTRIBUTED_OUTCOMES = ("fault", "timeout", "unsafe")  # located by what their detail names


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


def names_combine(detail: str | None) -> bool:
    """Whether a failure's detail puts it in the combine kernel: names it and no split kernel."""
    return bool(detail) and COMBINE_KERNEL in detail and SPLIT_KERNEL not in detail


def location_of(config: AttentionConfig, outcome: str, failed_gate: str | None, variant: str | None,
                metrics: Mapping[str, Any] | None = None, gates: Mapping[str, Any] | None = None,
                detail: str | None = None) -> str:
    """`combine` where the evidence places the failure in the split-KV combine (the module
    docstring says which), else the family of its variant."""
    if config.split_kv > 1:
        if outcome in NUMERIC_OUTCOMES and failed_gate != "partials" and metrics and gates:
            if partials_hold(config, metrics, gates):
                return COMBINE
        elif outcome in ATTRIBUTED_OUTCOMES and names_combine(detail):
            return COMBINE
    return family_of(variant)


@dataclass(frozen=True, order=True)
class Signature:
    outcome: str
    gate: str | None
    location: str   # a kernel family (cpu, rowwise, grouped, mma), `combine`, or NO_FAMILY

    @property
    def failing(self) -> bool:
        return self.outcome not in ("pass", "not_applicable")

    def label(self) -> str:
        return f"{self.outcome}/{self.gate or '-'}/{self.location}"

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)
