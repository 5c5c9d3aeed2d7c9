"""GET /compare: sweeps of several kernels side by side (store.kernels.kernel_comparison)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from api.schemas.common import Metric


class KernelSweep(BaseModel):
    id: int
    kernel: str = Field(description="the kernel as asked for (--kernel)")
    kernel_name: str
    kernel_version: str | None
    backend: str
    device: str | None
    seed: int
    status: str
    configs: int
    outcomes: dict[str, int]
    not_applicable: dict[str, int] = Field(description="not_applicable reasons and their counts")
    time_ratio_median: Metric = Field(description="median over the configs it ran that another kernel ran too of its "
                                                  "kernel time over the fastest kernel's")
    time_ratio_geomean: Metric
    timed: int = Field(description="configs that ratio is over")
    fastest: int = Field(description="configs on which it was the fastest")


class OnlyOne(BaseModel):
    config_hash: str
    config: dict[str, Any]
    sweep_id: int
    kernel: str
    outcome: str
    failed_gate: str | None
    others: dict[str, str | None] = Field(description="the other sweeps' outcomes, by sweep id")


class KernelComparison(BaseModel):
    sweeps: list[KernelSweep] = Field(description="one entry per sweep, in the order asked for")
    common: int = Field(description="configs present in every sweep (the same seed and distribution draw the same)")
    ran_by_all: int = Field(description="of those, configs every kernel ran")
    only_one: list[OnlyOne] = Field(description="configs failing on exactly one kernel while the others passed them")
    only_one_total: int
