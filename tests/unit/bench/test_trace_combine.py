"""bench/trace_combine.py turns the kernels' timeline marks (attention.hip ATTN_MARK: per block,
the global timer in slots 0-7, the SM clock in 8-15; zero where a block never reached a mark)
into first/last times per mark and per-block cycles per phase."""
from __future__ import annotations

import numpy as np
import pytest

from bench.trace_combine import BLOCKS, SLOTS, timeline


def marks(rows: dict[int, dict[int, tuple[int, int]]]) -> np.ndarray:
    """rows: block -> {mark: (timer ns, clock)}"""
    a = np.zeros((BLOCKS, SLOTS), dtype=np.uint64)
    for block, ms in rows.items():
        for k, (ns, clk) in ms.items():
            a[block, k], a[block, 8 + k] = ns, clk
    return a


def test_times_are_microseconds_from_the_first_block_and_skip_unreached_marks():
    split = marks({
        0: {0: (10_000, 1), 1: (20_000, 500), 2: (21_000, 2_500)},
        1: {0: (10_500, 7), 1: (22_000, 900), 2: (23_000, 2_900), 3: (24_000, 3_000), 4: (30_000, 15_000),
            5: (31_000, 16_000), 6: (33_000, 20_000)},
        2: {0: (11_000, 3), 1: (21_500, 800), 2: (22_500, 1_800), 3: (23_500, 2_000), 4: (29_000, 9_000)},
    })
    comb = marks({0: {0: (35_000, 5), 7: (37_500, 900)}, 5: {0: (35_200, 5), 7: (38_000, 900)}})
    tl = timeline(split, comb)
    assert tl["block start"] == {"n": 3, "first": 0.0, "last": 1.0}
    assert tl["main loop end"] == {"n": 3, "first": 10.0, "last": 12.0}
    assert tl["level-1 combiner in"]["n"] == 2 and tl["final combiner in"] == {"n": 1, "first": 21.0, "last": 21.0}
    assert "final combine run again" not in tl          # no block wrote mark 7
    assert tl["combine kernel block end"] == {"n": 2, "first": 27.5, "last": 28.0}
    # cycles on each block's own SM clock: level 1 took 12,000 and 7,000 cycles
    assert tl["level-1 combine cycles"] == {"n": 2, "median": 9_500.0, "max": 12_000}
    assert tl["final combine cycles"] == {"n": 1, "median": 4_000.0, "max": 4_000}
    assert tl["epilogue cycles"]["median"] == pytest.approx(2_000.0)


def test_a_clock_that_went_backwards_is_left_out():
    """A block's two marks on different SMs cannot happen, but a wrapped or unset clock must not
    show as a negative phase."""
    split = marks({0: {0: (1_000, 1), 1: (2_000, 9_000), 2: (3_000, 100)}})
    tl = timeline(split, marks({}))
    assert "epilogue cycles" not in tl
