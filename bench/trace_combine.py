"""Where a decode call's time goes after its split blocks finish: the split kernel built with
timeline marks (-DATTN_TRACE: thread 0 of every block writes the global nanosecond timer at
its start, its main loop's end, its partials written, and in the fused combine at each level's
start and end; the combine kernel's blocks at their start and end), for a few many-split
shapes with the combine kernel and with the combine fused (in two levels past 8 splits).

    python bench/trace_combine.py --out $OUT [--iters 30] [--cases 0,3] [--modes fused]
        [--define=-DX=Y ...]  [--trace-define=-DATTN_TRACE_TWICE=1]

Prints per case the device time (CUDA events, L2 flushed, median; the build without marks
beside it) and the timeline of one traced call in µs from the first block's start, with the SM
clock cycles of each block's phases. --define goes to both builds (a variant to compare),
--trace-define to the traced one only (ATTN_TRACE_TWICE: the final combine runs again, its code
warm, as mark 7). docs/decisions.md, "Decode's fixed costs", has what it showed."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels.launch as variants  # noqa: E402
from bench.kernels import Ours, Timer, decode_case, make_inputs  # noqa: E402
from kernels.autosplit import replace_split  # noqa: E402

CASES = [((1, 8, 1, 65536, 128), 128), ((1, 8, 1, 65536, 128), 64), ((1, 8, 1, 65536, 128), 8),
         ((1, 32, 8, 131072, 128), 32), ((8, 32, 8, 32768, 128), 16)]
SLOTS = 16                               # attention.hip ATTN_MARK: 8 timer marks, 8 clock marks
BLOCKS = 4096                            # attention.hip ATTN_TRACE_BLOCKS


def backend_with(defines: list[str]):
    from kernels.cache import KernelCache
    from kernels.backends.cuda import CudaBackend

    class Traced(CudaBackend):
        def compile_options(self, variant):
            return [*super().compile_options(variant), *defines]

    b = Traced(cache=KernelCache(enabled=False))
    b.kernel_path = "mma"
    return b


def _global(backend, module, name: str) -> tuple[int, int]:
    """The device address and size of the module's __device__ array `name`."""
    dptr, nbytes = backend._check(backend._driver.cuModuleGetGlobal(module, name.encode()), "cuModuleGetGlobal")
    return int(dptr), int(nbytes)


def read_marks(backend, module, name: str) -> np.ndarray:
    dptr, nbytes = _global(backend, module, name)
    host = np.zeros(BLOCKS * SLOTS, dtype=np.uint64)
    assert nbytes == host.nbytes
    backend._rt_dtoh(host, dptr)
    return host.reshape(BLOCKS, SLOTS)


def clear_marks(backend, module, name: str) -> None:
    dptr, nbytes = _global(backend, module, name)
    backend._rt_memset(dptr, 4, 0, nbytes // 4)


def timeline(split: np.ndarray, comb: np.ndarray) -> dict:
    """µs from the first split block's start: per mark its first and last time over the blocks
    that wrote it, and how many did."""
    live = split[:, 0] > 0
    t0 = split[live, 0].min()
    out = {}
    spans = [(split, 0, "block start"), (split, 1, "main loop end"), (split, 2, "partials written"),
             (split, 3, "level-1 combiner in"), (split, 4, "level-1 combine done"), (split, 5, "final combiner in"),
             (split, 6, "final combine done"), (split, 7, "final combine run again"),
             (comb, 0, "combine kernel block start"), (comb, 7, "combine kernel block end")]
    for marks, k, name in spans:
        col = marks[:, k]
        col = col[col > 0]
        if col.size:
            out[name] = {"n": int(col.size), "first": (col.min() - t0) / 1e3, "last": (col.max() - t0) / 1e3}
    # per-block SM clock cycles of each fused phase (the same SM, so the clock is consistent)
    for a, b, name in [(3, 4, "level-1 combine cycles"), (5, 6, "final combine cycles"), (1, 2, "epilogue cycles"),
                       (6, 7, "final combine again cycles")]:
        m = (split[:, 8 + a] > 0) & (split[:, 8 + b] > 0) & (split[:, 8 + a] < split[:, 8 + b])
        if m.any():
            cyc = split[m, 8 + b].astype(np.int64) - split[m, 8 + a].astype(np.int64)
            out[name] = {"n": int(m.sum()), "median": float(np.median(cyc)), "max": int(cyc.max())}
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--define", action="append", default=[], help="a compile option of both builds (-DX=Y)")
    ap.add_argument("--trace-define", action="append", default=[], help="a compile option of the traced build only")
    ap.add_argument("--cases", help="only these cases, by index into CASES (0,3)")
    ap.add_argument("--modes", default="combine kernel,fused")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    timer = Timer(torch, a.iters)
    traced, plain = backend_with(["-DATTN_TRACE=1", *a.define, *a.trace_define]), backend_with(a.define)
    cases = [CASES[int(i)] for i in a.cases.split(",")] if a.cases else CASES
    rows = []
    for shape, split in cases:
        case = decode_case(shape, "f16")
        cfg = replace_split(case.config, split)
        t = make_inputs(torch, cfg)
        for mode, limit in (("combine kernel", 1), ("fused", 1024)):
            if mode not in a.modes.split(","):
                continue
            variants.FUSED_COMBINE_MAX_SPLITS = limit
            if mode == "fused" and not variants.fuses_combine(cfg, traced.variant_for(cfg)):
                continue
            us_plain = timer(Ours(plain).runner(cfg, t)) * 1e6
            run = Ours(traced).runner(cfg, t)
            us_traced = timer(run) * 1e6
            module = run.loaded.module
            clear_marks(traced, module, "attn_trace")
            clear_marks(traced, module, "attn_trace_c")
            timer.flush()
            torch.cuda.synchronize()
            run()
            torch.cuda.synchronize()
            tl = timeline(read_marks(traced, module, "attn_trace"), read_marks(traced, module, "attn_trace_c"))
            row = {"defines": a.define, "shape": case.name, "split": split, "mode": mode, "us": us_plain, "us_traced": us_traced,
                   "calls": len(run.calls), "timeline": tl}
            rows.append(row)
            print(f"{a.tag}{case.name} s={split} {mode}: {us_plain:.1f} us ({us_traced:.1f} with marks, {len(run.calls)} launches)")
            for name, v in tl.items():
                if "first" in v:
                    print(f"    {name:28s} n={v['n']:5d}  {v['first']:8.2f} .. {v['last']:8.2f} us")
                else:
                    print(f"    {name:28s} n={v['n']:5d}  median {v['median']:.0f} cycles, max {v['max']}")
            sys.stdout.flush()
    traced.close()
    plain.close()
    (a.out / f"trace_combine{a.tag.strip().replace(' ', '_')}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
