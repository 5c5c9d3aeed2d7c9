"""The coverage report of a sweep (docs/spec.md §6 "Coverage"; sweeps.coverage.coverage_report)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

CellState = Literal["covered", "rare", "never"]


class StateCounts(BaseModel):
    covered: int
    rare: int
    never: int


class CoverageCell(BaseModel):
    """One cell of the space: (path, regime, feature, value) with its configs and failing configs."""

    path: str
    regime: str
    feature: str
    value: str
    configs: int
    failing: int
    state: CellState


class OutsideCell(BaseModel):
    """A cell some config landed in that the space says no config can reach."""

    path: str
    regime: str
    feature: str
    value: str
    configs: int


class CoverageReport(BaseModel):
    sweep_id: int
    paths: list[str] = Field(description="the kernel paths of the sweep's cell space (mma only where cuda ran)")
    regimes: list[str] = Field(description="the data regimes of the sweep's cell space (those it drew)")
    cell: str = Field(description="what a cell is: (path, regime, feature, value)")
    rare_below: int = Field(description="a cell with fewer configs than this (and at least one) is rare")
    cells_total: int = Field(description="cells of the space (the ones some config can reach)")
    totals: StateCounts
    by_regime: dict[str, StateCounts]
    by_path: dict[str, StateCounts]
    features: dict[str, list[str]] = Field(description="every feature and its values, in order (sweeps.coverage.FEATURES)")
    never: list[CoverageCell]
    rare: list[CoverageCell]
    outside: list[OutsideCell] = Field(description="cells outside the space that configs landed in "
                                                   "(sweeps.coverage.possible is out of date)")
    cells: list[CoverageCell] = Field(description="every cell of the space")
