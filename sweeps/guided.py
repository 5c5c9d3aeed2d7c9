"""Coverage-guided sampling (docs/spec.md §6): steer a sweep's draws to the least covered cells.

Each accepted config is the best of CANDIDATES draws that pass every prefilter and are not
duplicates: the one whose cells (sweeps.coverage, without the fact features, which only a run
gives) have the largest sum of 1 / (1 + configs in the cell), counted over the configs accepted
so far plus `prior` (cell counts of earlier sweeps). Ties go to the earliest draw, so the same
request, seed and prior give the same configs. The candidates not taken are counted
`coverage_skipped`; every draw counts against the draw cap.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from attnconfig.config import AttentionConfig
from sweeps.coverage import CellCounts, cells_of, predicted_path
from sweeps.filters import ALL_REASONS, DUPLICATE, Prefilter

CANDIDATES = 32
SKIPPED = "coverage_skipped"


class CapReached(RuntimeError):
    """The draw cap came before `samples` configs (sweeps.sampler raises SamplingExhausted)."""

    def __init__(self, accepted: int, filtered: dict[str, int]):
        self.accepted, self.filtered = accepted, filtered
        super().__init__(f"draw cap reached with {accepted} configs accepted")


def collect_guided(
    draw: Callable[[np.random.Generator], AttentionConfig],
    rng: np.random.Generator,
    prefilter: Prefilter,
    *,
    samples: int,
    cap: int,
    prior: CellCounts | None = None,
    mma: bool = False,
    candidates: int = CANDIDATES,
) -> tuple[list[AttentionConfig], list[str], dict[str, int], int]:
    """(configs, their content hashes, rejections per reason, draws); raises CapReached."""
    filtered = {r: 0 for r in ALL_REASONS}
    filtered[SKIPPED] = 0
    counts = CellCounts().merge(prior) if prior is not None else CellCounts()
    configs: list[AttentionConfig] = []
    hashes: list[str] = []
    seen: set[str] = set()
    draws = 0
    while len(configs) < samples:
        best: tuple[float, AttentionConfig, str, list] | None = None
        pool: set[str] = set()
        taken = 0
        while taken < candidates:
            if draws >= cap:
                if best is not None:
                    break
                raise CapReached(len(configs), filtered)
            c = draw(rng)
            draws += 1
            reason = prefilter.reason(c)
            h = c.content_hash() if reason is None else ""
            if reason is None and (h in seen or h in pool):
                reason = DUPLICATE
            if reason is not None:
                filtered[reason] += 1
                continue
            pool.add(h)
            taken += 1
            cells = cells_of(c, predicted_path(c, mma))
            score = sum(1.0 / (1 + counts.configs[cell]) for cell in cells)
            if best is None or score > best[0]:
                if best is not None:
                    filtered[SKIPPED] += 1
                best = (score, c, h, cells)
            else:
                filtered[SKIPPED] += 1
        _, c, h, cells = best
        seen.add(h)
        hashes.append(h)
        configs.append(c)
        counts.add(cells)
    return configs, hashes, filtered, draws
