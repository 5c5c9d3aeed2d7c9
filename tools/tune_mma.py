"""Measure the mma path's decode shape on the GPU: keys per tile, warps per tile and blocks per
SM (kernels/tuning.py MMA_DECODE_SHAPES), with the automatic split sized to each.

    python tools/tune_mma.py --out $OUT [--iters 20] [--dtypes f16]

Prints µs and TB/s per shape for every setting and, per head-dim class, the setting with the
best geometric mean; MMA_DECODE_SHAPES comes from this table.

    python tools/tune_mma.py --prefill [--settings 64:64:1,128:64:1] [--prefill-dims 64,128]

times bench/kernels.py's prefill cases (4096 x 4096, 32 heads, D = 128 or --prefill-dims, causal and not) instead,
in TFLOP/s, for settings block_m:tile_n:min_blocks (one key group; a warp per 16-row tile;
the kernels' mma_shape and MMA_PREFILL_TABLE).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.tuning import DecodeBench  # noqa: E402

# head-dim class (dqk + dv up to) -> its decode shapes, and the settings to measure:
# (tile_n, key_groups, min_blocks)
CLASSES = {
    128: ([(32, 32, 8, 2048, 64), (8, 32, 8, 32768, 64), (1, 8, 1, 65536, 64)],
          [(64, 4, 3), (64, 4, 4), (64, 2, 4), (128, 4, 3), (128, 4, 2), (128, 2, 3)]),
    256: ([(32, 32, 8, 2048, 64), (1, 32, 8, 131072, 128), (8, 32, 8, 32768, 128), (8, 32, 8, 4096, 128),
           (16, 64, 8, 8192, 128), (4, 32, 32, 16384, 128), (1, 8, 1, 65536, 128)],
          [(64, 4, 3), (64, 4, 2), (64, 4, 4), (128, 4, 3), (128, 4, 2), (128, 8, 2), (32, 2, 3), (32, 2, 4),
           (16, 1, 4)]),
    512: ([(8, 32, 8, 32768, 256), (1, 32, 8, 131072, 256), (1, 8, 1, 65536, 256)],
          [(32, 2, 3), (32, 2, 2), (16, 1, 3), (16, 1, 4)]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtypes", default="f16")
    ap.add_argument("--classes", default="256,512")
    ap.add_argument("--define", action="append", default=[], help="a compile option for every setting (-DX=Y)")
    ap.add_argument("--settings", help="only these settings, tile_n:key_groups:min_blocks,... (default: the class's)")
    ap.add_argument("--prefill", action="store_true",
                    help="the prefill cases; settings block_m:tile_n:min_blocks")
    ap.add_argument("--prefill-dims", default="128", help="head dims of the prefill cases (qk = v)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.prefill:
        return tune_prefill(a)

    rows = []
    for cls in map(int, a.classes.split(",")):
        shapes, settings = CLASSES[cls]
        if a.settings:
            settings = [tuple(map(int, x.split(":"))) for x in a.settings.split(",")]
        bench = DecodeBench(shapes, a.dtypes.split(","), a.iters)
        best = None
        for tile_n, groups, minb in settings:
            def shape(v, tile_n=tile_n, groups=groups, minb=minb):
                return dataclasses.replace(v, tile_n=tile_n, threads=32 * groups, min_blocks=minb)

            setting = {"class": cls, "tile_n": tile_n, "key_groups": groups, "min_blocks": minb,
                       **({"defines": " ".join(a.define)} if a.define else {})}
            try:
                row = bench.measure(setting, a.define, "mma", variant_map=shape)
            except Exception as exc:   # a setting the device cannot launch: say so, go on
                print(f"{setting}: failed: {exc}"[:300], flush=True)
                continue
            rows.append(row)
            best = row if best is None or row["geomean_TBps"] > best["geomean_TBps"] else best
        if best:
            print(f"best for dqk+dv <= {cls}: {best}", flush=True)
    (a.out / "tune_mma.json").write_text(json.dumps(rows, indent=2))


PREFILL_SETTINGS = [(64, 64, 1), (128, 64, 1), (64, 128, 1), (64, 32, 1)]


def tune_prefill(a: argparse.Namespace) -> None:
    settings = ([tuple(map(int, x.split(":"))) for x in a.settings.split(",")] if a.settings
                else PREFILL_SETTINGS)
    bench = DecodeBench([], a.dtypes.split(","), a.iters, prefill=True,
                        prefill_dims=tuple(map(int, a.prefill_dims.split(","))))
    rows = []
    for block_m, tile_n, minb in settings:
        def shape(v, block_m=block_m, tile_n=tile_n, minb=minb):
            return dataclasses.replace(v, block_m=block_m, threads=2 * block_m, tile_n=tile_n, min_blocks=minb)

        setting = {"block_m": block_m, "tile_n": tile_n, "min_blocks": minb,
                   **({"defines": " ".join(a.define)} if a.define else {})}
        try:
            rows.append(bench.measure(setting, a.define, "mma", variant_map=shape))
        except Exception as exc:   # a setting the device cannot launch: say so, go on
            print(f"{setting}: failed: {exc}"[:300], flush=True)
    if rows:
        print(f"best prefill setting: {max(rows, key=lambda r: r['geomean_TFLOPps'])}", flush=True)
    (a.out / "tune_mma_prefill.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
