"""Measure the grouped path's tuning knobs on the GPU: minimum blocks per SM (the register
budget), rows a thread loads before using them, and query rows per block.

    python bench/tune_grouped.py --out $OUT [--iters 20]

Prints µs and TB/s per shape for every setting and the setting with the best geometric mean;
the defaults in kernels/src/attention.hip and kernels/variants.py come from this table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels.variants as variants  # noqa: E402
from bench.kernels import Ours, Timer, decode_case, make_inputs  # noqa: E402
from kernels.autosplit import choose_split_kv, replace_split  # noqa: E402

SHAPES = [(8, 32, 8, 32768, 128), (1, 8, 1, 65536, 128), (4, 32, 32, 16384, 128), (16, 64, 8, 8192, 128),
          (8, 32, 8, 32768, 256)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
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
    cases = [decode_case(s, "f16") for s in SHAPES]
    inputs = {c.name: make_inputs(torch, c.config) for c in cases}
    rows = []
    for minb, unroll, max_rows in itertools.product((1, 2, 3), (4, 8), (4, 8)):
        backend = Tuned(cache=KernelCache(enabled=False))
        backend.defines = [f"-DATTN_GROUPED_MIN_BLOCKS={minb}", f"-DATTN_GROUPED_UNROLL={unroll}"]
        variants.GROUPED_MAX_ROWS = max_rows
        ours = Ours(backend)
        times = {}
        for case in cases:
            c = replace_split(case.config, choose_split_kv(case.config, sms))
            times[case.name] = timer(ours.runner(c, inputs[case.name]))
        gm = math.exp(sum(math.log(case.bytes / times[case.name]) for case in cases) / len(cases)) / 1e12
        rows.append({"min_blocks": minb, "unroll": unroll, "max_rows": max_rows, "geomean_TBps": gm,
                     "us": {k: v * 1e6 for k, v in times.items()}})
        print(f"min_blocks={minb} unroll={unroll} max_rows={max_rows}: geomean {gm:.2f} TB/s  " +
              "  ".join(f"{k} {v * 1e6:.0f}us" for k, v in times.items()), flush=True)
        backend.close()
    best = max(rows, key=lambda r: r["geomean_TBps"])
    print(f"best: {best}")
    (a.out / "tune_grouped.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
