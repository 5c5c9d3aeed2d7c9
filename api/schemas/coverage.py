"""The coverage report of a sweep (docs/spec.md §6 "Coverage"; sweeps.coverage.coverage_report)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

CellState = Literal["covered", "rare", "never"]
_PATH = "kernel path family: mma, grouped or rowwise"
_REGIME = "data regime of the configs (docs/spec.md §1)"
_FEATURE = "the feature: mask, kv_cache, gqa_ratio, splits, empty_splits, head_dim, dtype, layout, lse, logits, peak, masked_rows"
_VALUE = "one value of the feature (its bucket)"


class StateCounts(BaseModel):
    covered: int = Field(description="cells with at least rare_below configs")
    rare: int = Field(description="cells with 1 to rare_below - 1 configs")
    never: int = Field(description="cells no finished config reached")


class OutsideCell(BaseModel):
    """A cell some config landed in that the space says no config can reach."""

    path: str = Field(description=_PATH)
    regime: str = Field(description=_REGIME)
    feature: str = Field(description=_FEATURE)
    value: str = Field(description=_VALUE)
    configs: int = Field(description="finished configs in the cell")


class CoverageCell(OutsideCell):
    """One cell of the space: (path, regime, feature, value) with its configs and failing configs."""

    failing: int = Field(description="of those, configs that failed (fail, nan, fault, unsafe, error, timeout, oom)")
    state: CellState = Field(description="covered, rare or never")


class CoverageReport(BaseModel):
    sweep_id: int = Field(description="the sweep")
    paths: list[str] = Field(description="the kernel paths of the sweep's cell space (mma only where cuda ran)")
    regimes: list[str] = Field(description="the data regimes of the sweep's cell space (those it drew)")
    cell: str = Field(description="what a cell is: (path, regime, feature, value)")
    rare_below: int = Field(description="a cell with fewer configs than this (and at least one) is rare")
    cells_total: int = Field(description="cells of the space (the ones some config can reach)")
    totals: StateCounts = Field(description="cells of the space per state")
    by_regime: dict[str, StateCounts] = Field(description="cells per state, per data regime")
    by_path: dict[str, StateCounts] = Field(description="cells per state, per kernel path")
    features: dict[str, list[str]] = Field(description="every feature and its values, in order (sweeps.coverage.FEATURES)")
    never: list[CoverageCell] = Field(description="the cells no finished config reached")
    rare: list[CoverageCell] = Field(description="the rare cells")
    outside: list[OutsideCell] = Field(description="cells outside the space that configs landed in "
                                                   "(sweeps.coverage.possible is out of date)")
    cells: list[CoverageCell] = Field(description="every cell of the space")
