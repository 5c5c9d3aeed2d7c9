"""Measure the mma path's tuning knob on the GPU: the blocks per SM its decode variant's
register budget must allow (ATTN_MMA_DECODE_MIN_BLOCKS), with the automatic split sized to it.

    python bench/tune_mma.py --out $OUT [--iters 20]

Prints µs and TB/s per shape for every setting and the setting with the best geometric mean;
the default in kernels/src/attention.hip and kernels/autosplit.py comes from this table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.tuning import DecodeBench  # noqa: E402

SHAPES = [(8, 32, 8, 32768, 128), (1, 8, 1, 65536, 128), (4, 32, 32, 16384, 128), (16, 64, 8, 8192, 128),
          (8, 32, 8, 4096, 128), (8, 32, 8, 32768, 256)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtypes", default="f16,bf16")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    bench = DecodeBench(SHAPES, a.dtypes.split(","), a.iters)
    rows = [bench.measure({"min_blocks": minb}, [f"-DATTN_MMA_DECODE_MIN_BLOCKS={minb}"], "mma", blocks_per_sm=minb)
            for minb in (2, 3, 4)]
    best = max(rows, key=lambda r: r["geomean_TBps"])
    print(f"best: min_blocks={best['min_blocks']} ({best['geomean_TBps']:.2f} TB/s)")
    (a.out / "tune_mma.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
