"""Measure the mma path's tuning knob on the GPU: the blocks per SM its decode variant's
register budget must allow (ATTN_MMA_DECODE_MIN_BLOCKS), with the automatic split sized to it.

    python bench/tune_mma.py --out $OUT [--iters 20]

Prints µs and TB/s per shape for every setting and the setting with the best geometric mean;
the default in kernels/src/attention.hip and kernels/autosplit.py comes from this table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels import Ours, Timer, decode_case, make_inputs  # noqa: E402
from kernels.autosplit import choose_split_kv, replace_split  # noqa: E402

SHAPES = [(8, 32, 8, 32768, 128), (1, 8, 1, 65536, 128), (4, 32, 32, 16384, 128), (16, 64, 8, 8192, 128),
          (8, 32, 8, 4096, 128), (8, 32, 8, 32768, 256)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtypes", default="f16,bf16")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    import torch
    from kernels.cache import KernelCache
    from kernels.cuda import CudaBackend

    class Tuned(CudaBackend):
        defines: list[str] = []

        def compile_options(self, variant):
            return [*super().compile_options(variant), *self.defines]

    timer = Timer(torch, a.iters)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [decode_case(s, dt) for dt in a.dtypes.split(",") for s in SHAPES]
    for c in cases:
        c.name = f"{c.config.dtype} {c.name}"
    inputs = {c.name: make_inputs(torch, c.config) for c in cases}
    rows = []
    for minb in (2, 3, 4):
        backend = Tuned(cache=KernelCache(enabled=False))
        backend.kernel_path = "mma"
        backend.defines = [f"-DATTN_MMA_DECODE_MIN_BLOCKS={minb}"]
        ours = Ours(backend)
        times = {}
        for case in cases:
            c = replace_split(case.config, choose_split_kv(case.config, sms, blocks_per_sm=minb, mma=True))
            times[case.name] = timer(ours.runner(c, inputs[case.name]))
        gm = math.exp(sum(math.log(case.bytes / times[case.name]) for case in cases) / len(cases)) / 1e12
        rows.append({"min_blocks": minb, "geomean_TBps": gm, "us": {k: v * 1e6 for k, v in times.items()}})
        print(f"min_blocks={minb}: geomean {gm:.2f} TB/s  " +
              "  ".join(f"{k} {v * 1e6:.0f}us" for k, v in times.items()), flush=True)
        backend.close()
    best = max(rows, key=lambda r: r["geomean_TBps"])
    print(f"best: min_blocks={best['min_blocks']} ({best['geomean_TBps']:.2f} TB/s)")
    (a.out / "tune_mma.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
