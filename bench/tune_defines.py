"""Time the decode shapes with the kernels compiled under each of several -D macro sets, in one
process on the same inputs (an A/B of a compile-time switch, e.g. ATTN_CP_L2_PREFETCH).

    python bench/tune_defines.py --out $OUT --set= --set=-DATTN_CP_L2_PREFETCH=256 [--rounds 2]

(--set=VALUE: a value starting with -D would otherwise read as an option.)

Every set is measured `rounds` times, interleaved (A B A B ...), so drift between the first and
the last set shows as the spread of one set's rounds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.tuning import DecodeBench  # noqa: E402

SHAPES = [(1, 32, 8, 131072, 128), (8, 32, 8, 32768, 128), (8, 32, 8, 4096, 128), (16, 64, 8, 8192, 128),
          (4, 32, 32, 16384, 128), (1, 8, 1, 65536, 128), (32, 32, 8, 2048, 64), (8, 32, 8, 32768, 256)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtypes", default="f16")
    ap.add_argument("--path", default="mma")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", action="append", dest="sets", default=[],
                    help="space-separated compile options; give it once per set (\"\" = none)")
    a = ap.parse_args()
    if len(a.sets) < 2:
        ap.error("--set: give at least two sets to compare")
    a.out.mkdir(parents=True, exist_ok=True)
    bench = DecodeBench(SHAPES, a.dtypes.split(","), a.iters)
    rows = []
    for r in range(a.rounds):
        for opts in a.sets:
            rows.append({**bench.measure({"round": r, "set": opts or "(none)"}, opts.split(), a.path)})
    print("\nset: geomean TB/s per round")
    for opts in a.sets:
        gms = [x["geomean_TBps"] for x in rows if x["set"] == (opts or "(none)")]
        print(f"  {opts or '(none)':<40} " + "  ".join(f"{g:.3f}" for g in gms))
    (a.out / "tune_defines.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
