"""Host phases of run_config (inputs, reference, verify): the working tree's code against git HEAD's.

    .venv/bin/python bench/host_phases.py --samples 300 --seed 7
    .venv/bin/python bench/host_phases.py --samples 120 --seed 8 --check-only   (equality only)

Draws a sweep of the default distribution (--sweep-size configs, --seed, the GPU host's 8 GiB
split-KV budget), takes --samples of them evenly spaced in host cost (so the smallest and the
largest are in, and the mean stands for the sweep's), and runs on each config, in one process
and interleaved (--repeat times, each side first as often as second; a phase counts its best
run), what sweeps/runner.py runs:
make_inputs, attention_splitkv(magnitude=True) + attention_lowprec, and verify_outputs on the
outputs of the cpu backend (its own time is not counted). The old code is git HEAD's reference/
package, extracted into a temporary directory and imported under another name.

Every result is hashed on both sides: the input bytes, every array of the split-KV result and of
the low output, and the metrics (floats by their hex): the run fails unless all are equal. It
also runs split_partials (what the cpu backend runs) with P rounded and with each kernel defect
on both sides and compares those. BLAS is capped to one thread, as sweeps/threads.py does for
the workers, and freed memory is kept or returned as the workers' setting says
(core.settings heap_retain_mb, ATTNSWEEP_HEAP_RETAIN_MB; 0, glibc's defaults, unless set).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    # Run as a file (or as a pool's copy of it), this module's folder comes first on sys.path
    # and bench/reference.py would shadow the `reference` package: put the repository root there.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != _here]

from core.settings import Settings  # noqa: E402
from sweeps.heap import retain_freed_memory  # noqa: E402
from sweeps.threads import cap_blas_threads  # noqa: E402  (before numpy is imported)

cap_blas_threads()
# As the workers keep freed memory: with 1024 (an earlier default) np.zeros of
# the reference's partials cleared them in the heap, 10% of its time here; with 0 fresh zero pages.
retain_freed_memory(Settings().heap_retain_mb)

import numpy as np  # noqa: E402

import reference as new  # noqa: E402
from kernels.backends.base import NUMERIC_DEFECTS  # noqa: E402
from kernels.backends.cpu import CpuEmulationBackend  # noqa: E402
from reference.inputs import value_dtype  # noqa: E402
from sweeps.filters import host_cost  # noqa: E402
from sweeps.sampler import sample  # noqa: E402
from sweeps.spec import SweepSpec  # noqa: E402

HEAD_NAME = "reference_head"
GPU_HOST_BUDGET = 8 << 30  # docs/spec.md §6: device memory // 8, clamped to 8 GiB on an H200
PHASES = ("inputs", "reference", "verify")


def load_head(tmp: Path, rev: str = "HEAD", old_dir: str | None = None):
    """git `rev`'s reference/ package (or the one in old_dir, where no git is), importable as
    reference_head."""
    if old_dir is None:
        names = subprocess.run(["git", "ls-tree", "--name-only", rev, "reference/"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
        sources = {Path(name).name: subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True,
                                                   capture_output=True, text=True).stdout
                   for name in names if name.endswith(".py")}
    else:
        sources = {f.name: f.read_text() for f in Path(old_dir).glob("*.py")}
    pkg = tmp / HEAD_NAME
    pkg.mkdir()
    for name, text in sources.items():
        text = re.sub(r"^(\s*)(from|import) reference(?=[.\s])", rf"\1\2 {HEAD_NAME}", text, flags=re.M)
        (pkg / name).write_text(text)
    sys.path.insert(0, str(tmp))
    import reference_head
    return reference_head


def digest(value, h=None) -> str:
    """A hash of arrays (dtype, shape, bytes), numbers (floats by hex) and containers of them;
    `h` a hashlib object to feed (several calls, one hash) instead of a fresh one."""
    h = h if h is not None else hashlib.sha256()

    def feed(v):
        if isinstance(v, np.ndarray):
            h.update(f"a{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).reshape(-1).view(np.uint8).data)  # no copy of the bytes
        elif isinstance(v, dict):
            for k in sorted(v):
                h.update(f"k{k}".encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            h.update(f"l{len(v)}".encode())
            for x in v:
                feed(x)
        elif isinstance(v, float):
            h.update(f"f{v.hex()}".encode())
        else:
            h.update(f"o{v!r}".encode())
    feed(value)
    return h.hexdigest()


def reference_digest(c, ref, low) -> str:
    """The split-KV result's arrays and the low output's values in its storage type (the new
    runner keeps them in float32, HEAD's held them in that type)."""
    rows = ref.row_scales
    low = low.astype(new.output_dtypes(c)[0])
    return digest([ref.out_f32, ref.lse_f32, ref.o_partials, ref.lse_partials, ref.valid_splits, ref.block_n,
                   ref.out, ref.lse, rows.out, rows.partials, low])


def run_side(mod, c, inputs, out, block_n: int, timings: dict[str, float]):
    """One side's phases on c; returns (inputs, reference result, low, metrics)."""
    t0 = time.perf_counter()
    drawn = mod.make_inputs(c)
    t1 = time.perf_counter()
    ref = mod.attention_splitkv(c, inputs, block_n=block_n, magnitude=True)
    # As sweeps/runner.py calls each side's code (HEAD's took no as_float32).
    low = mod.attention_lowprec(c, inputs, **({"as_float32": True} if mod is new else {}))
    t2 = time.perf_counter()
    metrics = mod.verify_outputs(c, ref, low, out.out, out.lse, out.o_partials, out.lse_partials,
                                 magnitude=ref.row_scales)
    t3 = time.perf_counter()
    for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2)):
        timings[phase] += dt
    return drawn, ref, low, metrics


def emulation_digest(mod, c, inputs, block_n: int) -> str:
    """split_partials as the cpu backend calls it, with its P rounding and each defect; and the
    low output as its other callers take it (in the storage type)."""
    p_dtype = None if c.dtype == "f32" else value_dtype(c.dtype)
    h = hashlib.sha256()
    digest(mod.attention_lowprec(c, inputs), h)
    with np.errstate(all="ignore"):
        for defects in [frozenset()] + [frozenset([d]) for d in sorted(NUMERIC_DEFECTS)]:
            # One defect's partials at a time: those of a large split_kv fill gigabytes.
            parts = mod.split_partials(c, inputs, block_n, defects, p_dtype)
            digest(parts, h)
            if c.split_kv > 1:
                digest(mod.combine_unmasked(*parts), h)
            del parts
    return h.hexdigest()


def pick(configs, samples: int):
    """`samples` configs evenly spaced in host cost, smallest and largest included."""
    ranked = sorted(configs, key=host_cost)
    idx = np.unique(np.linspace(0, len(ranked) - 1, min(samples, len(ranked))).round().astype(int))
    return [ranked[i] for i in idx]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sweep-size", type=int, default=2000)
    parser.add_argument("--block-n", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="runs per side and config (best one counts)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes side by side, as a sweep runs one per core (each takes every jobs-th config)")
    parser.add_argument("--rev", default="HEAD", help="the old code's git revision")
    parser.add_argument("--old-dir", help="the old reference/ package's folder, instead of git")
    parser.add_argument("--check-only", action="store_true", help="compare results, print no timings")
    parser.add_argument("--no-emulation-check", action="store_true", help="skip the split_partials comparison")
    args = parser.parse_args()
    configs = picked(args)
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            shares = pool.starmap(run_share, [(vars(args), k) for k in range(args.jobs)])
    else:
        shares = [run_share(vars(args), 0)]
    times = {name: [None] * len(configs) for name in ("old", "new")}
    checked, mismatches = 0, []
    for share in shares:
        for name in times:
            for i, t in share["times"][name].items():
                times[name][i] = t
        checked += share["checked"]
        mismatches += share["mismatches"]
    report(configs, times, args)
    print(f"equality: {len(configs)} configs (seed {args.seed}, host cost "
          f"{host_cost(configs[0]):.3g}..{host_cost(configs[-1]):.3g} flops), {checked} hashes compared on "
          f"both sides, {len(mismatches)} differ")
    for line in mismatches:
        print("  DIFFERS", line)
    if mismatches:
        sys.exit(1)


def picked(args) -> list:
    return pick(sample(SweepSpec(samples=args.sweep_size, seed=args.seed), GPU_HOST_BUDGET).configs, args.samples)


def run_share(options: dict, share: int) -> dict:
    """Time and compare configs share, share + jobs, ... of the picked ones, in this process."""
    args = argparse.Namespace(**options)
    with tempfile.TemporaryDirectory() as tmp:
        old = load_head(Path(tmp), args.rev, args.old_dir)
        configs = picked(args)
        mine = range(share, len(configs), args.jobs)
        backend = CpuEmulationBackend(block_n=args.block_n)
        # Touch a large block once: in a VM the first touch of memory costs several times a
        # reuse, and would land on whichever side first reaches a new peak.
        np.ones((4 << 30) // args.jobs, dtype=np.uint8)
        sides = {"old": old, "new": new}
        times = {name: {} for name in sides}
        mismatches: list[str] = []
        checked = 0
        for i in mine:
            c = configs[i]
            inputs = new.make_inputs(c)
            out = backend.run(backend.prepare(c), c, inputs)
            d = {}
            for name in sides:
                times[name][i] = dict.fromkeys(PHASES, 0.0)
            for rep in range(args.repeat):
                # Each side goes first as often as second; a phase's time is its best run.
                for name in (("old", "new") if (i + rep) % 2 == 0 else ("new", "old")):
                    t = dict.fromkeys(PHASES, 0.0)
                    r = run_side(sides[name], c, inputs, out, args.block_n, t)
                    # Hashed at once: two sides' results of a large config do not fit together.
                    d[name] = (digest(r[0]), reference_digest(c, r[1], r[2]), digest(r[3]))
                    del r
                    best = times[name][i]
                    for phase in PHASES:
                        best[phase] = t[phase] if rep == 0 else min(best[phase], t[phase])
            del out
            for what, a, b in zip(("inputs", "reference", "metrics"), d["old"], d["new"]):
                checked += 1
                if a != b:
                    mismatches.append(f"config {i} {what}: {c.model_dump_json()}")
        # After the timings: the emulation allocates every split's partials five times over,
        # and the memory it leaves fragmented would slow whichever side ran next.
        for i in [] if args.no_emulation_check else mine:
            c = configs[i]
            inputs = new.make_inputs(c)
            checked += 1
            if emulation_digest(old, c, inputs, args.block_n) != emulation_digest(new, c, inputs, args.block_n):
                mismatches.append(f"config {i} split_partials: {c.model_dump_json()}")
    return {"times": times, "checked": checked, "mismatches": mismatches}


def report(configs, times, args) -> None:
    if args.check_only:
        return
    n = len(configs)
    quartiles = np.array_split(np.arange(n), 4)
    print(f"{n} configs of a {args.sweep_size}-config default sweep, seed {args.seed}, block_n {args.block_n}, "
          f"{args.jobs} process(es) side by side, best of {args.repeat} runs, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, numpy {np.__version__}")
    header = f"{'phase':12s} {'old ms/cfg':>11s} {'new ms/cfg':>11s} {'old/new':>8s}   " + "  ".join(
        f"q{k + 1} old/new ms" for k in range(4))
    print(header)
    print("-" * len(header))
    for phase in PHASES + ("host total",):
        def per(name, idx):
            rows = [times[name][i] for i in idx]
            return 1e3 * sum(sum(r.values()) if phase == "host total" else r[phase] for r in rows) / len(rows)
        o, w = per("old", range(n)), per("new", range(n))
        qs = "  ".join(f"{per('old', q):7.2f}/{per('new', q):<7.2f}" for q in quartiles)
        print(f"{phase:12s} {o:11.2f} {w:11.2f} {o / w:8.3f}   {qs}")


if __name__ == "__main__":
    main()
