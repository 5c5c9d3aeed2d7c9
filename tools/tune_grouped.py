"""Measure the grouped path's tuning knobs on the GPU: minimum blocks per SM (the register
budget), rows a thread loads before using them, and query rows per block.

    python tools/tune_grouped.py --out $OUT [--iters 20]

Prints µs and TB/s per shape for every setting and the setting with the best geometric mean;
the defaults in kernels/src/attention.hip and kernels/tuning.py come from this table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels.select as variants  # noqa: E402
from tools.tuning import DecodeBench  # noqa: E402

SHAPES = [(8, 32, 8, 32768, 128), (1, 8, 1, 65536, 128), (4, 32, 32, 16384, 128), (16, 64, 8, 8192, 128),
          (8, 32, 8, 32768, 256)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    bench = DecodeBench(SHAPES, ["f16"], a.iters)
    rows = []
    for minb, unroll, max_rows in itertools.product((1, 2, 3), (4, 8), (4, 8)):
        variants.GROUPED_MAX_ROWS = max_rows
        rows.append(bench.measure({"min_blocks": minb, "unroll": unroll, "max_rows": max_rows},
                                  [f"-DATTN_GROUPED_MIN_BLOCKS={minb}", f"-DATTN_GROUPED_UNROLL={unroll}"],
                                  "grouped"))
    best = max(rows, key=lambda r: r["geomean_TBps"])
    print(f"best: {best}")
    (a.out / "tune_grouped.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
