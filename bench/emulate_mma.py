"""The GPU suite's configs on the host-emulated tensor-core kernel, checked as the GPU suite checks
them: no GPU needed, slow (minutes), for what does not fit the unit tests' time.

    .venv/bin/python bench/emulate_mma.py cases                      # tests/gpu's mma cases (120)
    .venv/bin/python bench/emulate_mma.py random --n 120 --max-cost 3e6 [--seed 11]
    ATTNSWEEP_MMA_PREFILL_ROW_TILES=2 .venv/bin/python bench/emulate_mma.py cases --prefill-only

Each config runs through tests/unit/kernels/test_variants.py's HostEmuBackend with the mma path
(kernels/src/host_emu.h emulates mma.sync, ldmatrix and cp.async) and is checked by
tests/gpu/test_cuda_backend.py's check_run (verify_outputs against the float64 exact reference
and the split-KV reference, the GPU suite's bounds). `random` draws the GPU suite's
random_configs made eligible for mma (as_mma), up to --max-cost (g * Hq * Sq * Sk * (Dqk + Dv +
8)). --prefill-only keeps the configs whose rows per kv head pass one 16-row tile. Prints each
failing config and a summary; exits 1 if any fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gpu_suite import gpu_suite, load_by_path  # noqa: E402
from kernels.cache import KernelCache  # noqa: E402
from kernels.select import select_variant  # noqa: E402
from kernels.tuning import MMA_DECODE_ROWS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", choices=("cases", "random"))
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--max-cost", type=float, default=3e6)
    ap.add_argument("--prefill-only", action="store_true")
    a = ap.parse_args()
    suite = gpu_suite()
    emu = load_by_path("attnsweep_host_emu_backend", ROOT / "tests/unit/kernels/test_variants.py")
    configs = (suite.MMA_CASES if a.configs == "cases"
               else [suite.as_mma(c) for c in suite.random_configs(a.n, seed=a.seed, max_cost=a.max_cost)])
    if a.prefill_only:
        configs = [c for c in configs if c.gqa_ratio * c.seq_len_q > MMA_DECODE_ROWS]
    backend = emu.HostEmuBackend(cache=KernelCache(Path(tempfile.mkdtemp(prefix="emulate-mma-")), enabled=True),
                                 mma=True)
    t0, failing, variants = time.perf_counter(), 0, set()
    for i, c in enumerate(configs):
        inputs, prepared, res = suite._run_on(backend, c, "mma")
        fails, _ = suite.check_run(c, inputs, res, prepared.block_n)
        variants.add(prepared.variant)
        if fails:
            failing += 1
            print(f"FAIL {prepared.variant} {fails} {c.to_json()}", flush=True)
        print(f"\r{i + 1}/{len(configs)} configs, {failing} failing", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    # which tiles and exponentials ran: the defaults come from MMA_PREFILL_TABLE and the environment
    ran = sorted({select_variant(c, mma=True) for c in configs}, key=lambda v: v.name)
    row_tiles = sorted({v.row_tiles for v in ran})
    print(f"{a.configs}: {len(configs)} configs on {len(variants)} mma variants (row tiles {row_tiles}), "
          f"{failing} failing, {time.perf_counter() - t0:.0f} s")
    for v in ran:
        print(f"  {v.name}{'  ATTN_MMA_EXP2' if v.mma_exp2 else ''}")
    sys.exit(1 if failing else 0)


if __name__ == "__main__":
    main()
