"""What the guard zones cost a sweep: backend.run with them against without, in one process.

    python3 bench/guards.py --backend cuda --samples 300 --seed 7 --repeat 3

For each config of a default sweep (same sampler, same prefilters), the backend's run (copies
in, the memsets of the guards and NaN fills, launches, copies out, the guard check) is timed
with guard zones (kernels/guards.py) and without, alternately, `--repeat` times each; and the
config's whole time in the runner (inputs, run, reference, verification) once. The cost is the
difference of the medians summed over the configs, as a share of the summed runner time: the
share of a sweep's worker time the guards take, which is the share of throughput they cost.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels import get_backend  # noqa: E402
from kernels.guards import GUARD_BYTES  # noqa: E402
from reference import make_inputs  # noqa: E402
from sweeps.plan import resolve_budget  # noqa: E402
from sweeps.runner import run_config  # noqa: E402
from sweeps.sampler import sample  # noqa: E402
from sweeps.spec import SweepSpec  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    backend = get_backend(args.backend)
    info = backend.device_info()
    if not hasattr(backend, "guard_bytes"):
        ap.error(f"--backend {info.backend}: the guards of a device backend are measured; the cpu emulation "
                 "keeps O's guard in host memory")
    spec = SweepSpec(samples=args.samples, seed=args.seed, backend=info.backend)
    configs = sample(spec, resolve_budget(spec, info.total_memory).bytes).configs
    with_guards = without = whole = 0.0
    timed = 0
    for c in configs:
        result = run_config(c, backend)   # compiles, and the config's whole time
        if result.outcome == "not_applicable":
            continue
        prepared = backend.prepare(c)
        inputs = make_inputs(c)
        on, off = [], []
        for _ in range(args.repeat):
            for guard, times in ((GUARD_BYTES, on), (0, off)):
                backend.guard_bytes = guard
                t0 = time.perf_counter()
                backend.run(prepared, c, inputs)
                times.append(time.perf_counter() - t0)
        backend.guard_bytes = GUARD_BYTES
        with_guards += statistics.median(on)
        without += statistics.median(off)
        whole += result.timings["total_s"]
        timed += 1
    cost = (with_guards - without) / whole if whole else float("nan")
    print(f"{info.backend} on {info.device}: {timed} configs of a {args.samples}-config default sweep (seed {args.seed}), "
          f"median of {args.repeat} runs each")
    print(f"backend.run summed: with guards {with_guards:.3f} s, without {without:.3f} s "
          f"(ratio {with_guards / without:.3f}x)")
    print(f"runner time summed (inputs, run, reference, verify): {whole:.3f} s")
    print(f"guard cost: {100 * cost:+.2f}% of the sweep's worker time")
    return {"configs": timed, "with_s": with_guards, "without_s": without, "whole_s": whole, "cost": cost}


if __name__ == "__main__":
    main()
