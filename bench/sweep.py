"""Sweep throughput: validated configs per second through the real embedded path.

    .venv/bin/python -m bench.sweep --backend cuda                      (the GPU host: 2,000 configs)
    .venv/bin/python -m bench.sweep --backend cpu --samples 40 --jobs 2  (a quick check anywhere)

Plans one sweep (default distribution, --seed, --samples) and runs it twice through
workers/embedded.py, exactly what `attnsweep run --jobs N` does (a spawned process pool, one
result row per config in the database):

1. warm: every kernel variant of the sweep is compiled into the compile cache first (not
   timed), then the sweep runs on fresh processes that find them there;
2. cold: the same sweep with ATTNSWEEP_KERNEL_CACHE_DISABLE=1 (kernels/cache.py): no disk
   cache and no in-process reuse, every config compiles its variant;
3. with --baseline-env VAR=VALUE: the warm sweep with those variables set (what a change
   replaced, switched by a variable its code reads), then the warm sweep
   once more, and the ratios of the two warm runs' mean to the baseline;
4. with --repeat: the warm sweep's configs once more, as CI sweeps a commit after the last
   one: their inputs and references come from the data cache (sweeps/datacache.py) the first
   run filled (a fresh folder unless --data-cache names one; without --repeat or --data-cache
   there is no data cache, as in a default deployment);
5. with --confined: the warm sweep once more with the shipped kernels/src as a source bundle
   (plus a comment, so it is not the shipped source): every config's kernel is compiled and run
   in a confined process (isolation/, docs/security.md), as a CI sweep of a fetched commit's
   are; then the ratio of its throughput and of each phase to the warm run's: the cost of the
   confinement.

For each it prints configs/s, the device's busy share (the kernels' event seconds summed over
the processes, over the wall time: the share of the sweep one GPU spends running kernels;
on cpu the emulation's seconds), the data cache's hits, and where the worker time goes: compile, inputs, run (the
backend's launch call: transfers + kernel; on cpu the emulation), of it the kernel's event
time and the transfers, reference, verify, store (the main process's database write), and the
rest of run_config. Then the cost by config size (quartiles of the reference's flops), which
shows the fixed per-config overhead of small configs. A JSON summary goes to --out.

The target: >= 50 configs/s warm on one H200 host with 16 cores (2,000 configs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from isolation.confined import backend_for
from kernels import get_backend
from kernels.source import SRC_DIR, KernelSource, local_source
from store.bundles import save_bundle
from store.db import session_scope, unit_of_work
from store.migrate import upgrade
from store import repo
from workers.embedded import execute_sweep, start_pool_server
from sweeps.filters import host_cost, reference_flops
from sweeps.plan import plan_sweep
from sweeps.result import ConfigResult
from sweeps.spec import SweepSpec
from workers.threads import cap_blas_threads

# (label, timing key); run_wall_s holds transfers + kernel, run_s and transfer_s are inside it.
PHASES = (("compile", "compile_s"), ("inputs", "inputs_s"), ("transfers+kernel", "run_wall_s"),
          ("reference", "reference_s"), ("verify", "verify_s"), ("store", "store_s"))
INSIDE_RUN = (("  kernel (events)", "run_s"), ("  transfers", "transfer_s"))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_warm_backend = None


def _prewarm_init(backend_name: str, source: KernelSource | None = None) -> None:
    global _warm_backend
    # One device context per process, not per variant; a bundle's, confined.
    _warm_backend = backend_for(backend_name, source=source)


def _prewarm_one(config: dict) -> float:
    from attnconfig import parse_config

    try:
        t0 = time.perf_counter()
        _warm_backend.prepare(parse_config(config))
        return time.perf_counter() - t0
    except Exception:  # a config the backend cannot prepare is the sweep's business, not ours
        return 0.0


def prewarm(db_url: str, sweep_id: int, backend_name: str, jobs: int, source: KernelSource | None = None) -> dict:
    """Compile every variant of the sweep into the cache: one config per variant name."""
    import multiprocessing as mp

    from attnconfig import parse_config

    with session_scope(db_url) as s:
        configs = [cfg for _hash, cfg in repo.queued_configs(s, sweep_id)]
    backend = get_backend(backend_name)
    try:
        name_of = getattr(backend, "variant_for", None) or getattr(backend, "variant_name")
        by_variant: dict[str, dict] = {}
        for cfg in configs:
            try:
                name = name_of(parse_config(cfg))
                name = getattr(name, "name", name)
            except Exception:
                continue
            by_variant.setdefault(name, cfg)
    finally:
        backend.close()
    t0 = time.perf_counter()
    work = list(by_variant.values())
    if jobs > 1 and len(work) > 1:
        with mp.get_context("spawn").Pool(min(jobs, len(work)), initializer=_prewarm_init,
                                          initargs=(backend_name, source)) as pool:
            compile_s = sum(pool.map(_prewarm_one, work, chunksize=1))
    else:
        _prewarm_init(backend_name, source)
        compile_s = sum(map(_prewarm_one, work))
        _warm_backend.close()
    return {"variants": len(work), "wall_s": time.perf_counter() - t0, "compile_s": compile_s}


def run_once(db_url: str, spec: SweepSpec, backend_name: str, jobs: int, total_memory: int | None,
             env: dict[str, str], warm_first: bool, source: KernelSource | None = None) -> dict:
    """One sweep of `spec`; `env` is set while it runs (the pool's processes take the parent's
    environment of the moment). With `source`, the sweep tests that bundle (run confined)."""
    with session_scope(db_url) as s:
        sweep = repo.store_plan(s, plan_sweep(spec, device_total_memory=total_memory))
        if source is not None:
            sweep.source_hash = save_bundle(s, source)
        sweep_id = sweep.id
    warmup = prewarm(db_url, sweep_id, backend_name, jobs, source) if warm_first else None
    results: list[ConfigResult] = []
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        t0, epoch0 = time.perf_counter(), time.time()
        with unit_of_work(db_url) as session:
            execute_sweep(session, sweep_id, backend_name, jobs=jobs, on_result=results.append)
        wall = time.perf_counter() - t0
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    summary = summarize(results, wall, jobs, sweep_id, warmup)
    summary["pool_idle"] = pool_idle(results, epoch0, wall)
    summary["memory"] = process_memory(results)
    return summary


def process_memory(results: list[ConfigResult]) -> dict | None:
    """Per worker process: its peak resident memory, and the most it held between configs
    (after a config's arrays were freed). MiB; sums over processes."""
    peak: dict[float, float] = {}
    held: dict[float, float] = {}
    for r in results:
        pid = r.timings.get("pid")
        if pid is None or "rss_mb" not in r.timings:
            continue
        peak[pid] = max(peak.get(pid, 0.0), r.timings["rss_peak_mb"])
        held[pid] = max(held.get(pid, 0.0), r.timings["rss_mb"])
    if not peak:
        return None
    return {"processes": len(peak), "peak_max_mb": max(peak.values()), "peak_sum_mb": sum(peak.values()),
            "between_max_mb": max(held.values()), "between_sum_mb": sum(held.values())}


def summarize(results: list[ConfigResult], wall: float, jobs: int, sweep_id: int, warmup: dict | None) -> dict:
    def total(key: str) -> float:
        return float(sum(r.timings.get(key) or 0.0 for r in results))

    worker_s = total("total_s")
    busy_s = worker_s + total("store_s")
    phases = {label: total(key) for label, key in PHASES}
    phases["other (runner)"] = max(0.0, worker_s - sum(v for k, v in phases.items() if k != "store"))
    inside = {label.strip(): total(key) for label, key in INSIDE_RUN}
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    return {
        "sweep_id": sweep_id,
        "configs": len(results),
        "wall_s": wall,
        "configs_per_s": len(results) / wall if wall > 0 else 0.0,
        "jobs": jobs,
        # Σ worker time / (wall x jobs): below 1 the pool waited (start-up, the tail, the store).
        "worker_s": worker_s,
        "worker_utilisation": worker_s / (wall * jobs) if wall > 0 else 0.0,
        # The kernels' event time over the wall time: one device shared by every process.
        "device_busy": total("run_s") / wall if wall > 0 else 0.0,
        "kernel_over_worker": total("run_s") / worker_s if worker_s > 0 else 0.0,
        "data_cache": {"inputs_hits": int(total("inputs_cached")), "reference_hits": int(total("reference_cached")),
                       "ran": sum(1 for r in results if "reference_s" in r.timings)},
        "outcomes": outcomes,
        "phases_s": phases,
        "phases_share": {k: (v / busy_s if busy_s else 0.0) for k, v in phases.items()},
        "inside_run_s": inside,
        "per_config_s": {k: v / max(1, len(results)) for k, v in phases.items()},
        "by_size": by_size(results),
        "prewarm": warmup,
    }


def compare_runs(runs: list[dict], baseline: dict) -> dict:
    """The mean of `runs` against `baseline`: throughput ratio, worker seconds per config, and
    per phase baseline seconds / ours (above 1: ours is faster)."""
    def per_config(summary: dict, phase: str) -> float:
        return summary["phases_s"][phase] / max(1, summary["configs"])

    def worker(summary: dict) -> float:
        return summary["worker_s"] / max(1, summary["configs"])

    phases = [p for p in baseline["phases_s"] if baseline["phases_s"][p] > 0]
    return {
        "throughput": float(np.mean([r["configs_per_s"] for r in runs])) / baseline["configs_per_s"],
        "worker_s": float(np.mean([worker(r) for r in runs])),
        "baseline_worker_s": worker(baseline),
        "phase_speedup": {p: per_config(baseline, p) / max(1e-12, float(np.mean([per_config(r, p) for r in runs])))
                          for p in phases},
    }


def pool_idle(results: list[ConfigResult], epoch0: float, wall: float) -> dict | None:
    """Process-seconds the pool spent outside run_config, from each result's epoch times
    (workers/embedded.py): starting (spawn, imports, the backend and its GPU context), before
    its first config; between configs (queues, pickling, freeing the last config's memory);
    after its last (the tail)."""
    by_pid: dict[float, list[ConfigResult]] = {}
    for r in results:
        if "pid" in r.timings:
            by_pid.setdefault(r.timings["pid"], []).append(r)
    if not by_pid:
        return None
    start = between = tail = 0.0
    ready = []
    for runs in by_pid.values():
        runs.sort(key=lambda r: r.timings["began_at"])
        ready.append(runs[0].timings["ready_at"] - epoch0)
        start += runs[0].timings["began_at"] - epoch0
        for a, b in zip(runs, runs[1:]):
            between += b.timings["began_at"] - a.timings["began_at"] - a.timings["total_s"]
        tail += epoch0 + wall - runs[-1].timings["began_at"] - runs[-1].timings["total_s"]
    # The tail's cause: the configs that finished last, and where host_cost ranked them (rank 0
    # is the costliest, which the pool starts first).
    ranked = sorted((r for rs in by_pid.values() for r in rs), key=lambda r: -host_cost(r.config))
    rank = {id(r): i for i, r in enumerate(ranked)}
    last = sorted(ranked, key=lambda r: r.timings["began_at"] + r.timings["total_s"])[-len(by_pid):]
    return {"processes": len(by_pid), "start_s": start, "between_s": between, "tail_s": tail,
            "ready_min_s": min(ready), "ready_max_s": max(ready),
            "last_finished": [{"config": r.config.to_json(), "began_s": r.timings["began_at"] - epoch0,
                               "total_s": r.timings["total_s"], "host_cost_rank": rank[id(r)]} for r in last]}


def by_size(results: list[ConfigResult]) -> list[dict]:
    """Mean seconds per config by quartile of reference flops: the fixed overhead shows as the
    first quartile's total_s."""
    ran = [r for r in results if "total_s" in r.timings]
    if not ran:
        return []
    flops = np.array([reference_flops(r.config) for r in ran], dtype=float)
    order = np.argsort(flops, kind="stable")
    rows = []
    for q, idx in enumerate(np.array_split(order, 4)):
        if len(idx) == 0:
            continue
        pick = [ran[i] for i in idx]
        mean = lambda key: float(np.mean([r.timings.get(key) or 0.0 for r in pick]))  # noqa: E731
        rows.append({"quartile": q + 1, "configs": len(pick), "flops_max": float(flops[idx].max()),
                     "total_s_mean": mean("total_s"),
                     "total_s_median": float(np.median([r.timings["total_s"] for r in pick])),
                     **{f"{key}_mean": mean(key) for _, key in PHASES}})
    return rows


def print_run(name: str, summary: dict) -> None:
    print(f"\n{name}: {summary['configs']} configs in {summary['wall_s']:.1f} s = "
          f"{summary['configs_per_s']:.1f} configs/s ({summary['jobs']} jobs, worker utilisation "
          f"{summary['worker_utilisation']:.0%}); outcomes {summary['outcomes']}")
    hits = summary.get("data_cache")
    print(f"  device busy {summary['device_busy']:.1%} of the wall time (kernel events / wall); kernel "
          f"{summary['kernel_over_worker']:.2%} of worker time"
          + (f"; data cache hits: inputs {hits['inputs_hits']}, references {hits['reference_hits']} of "
             f"{hits['ran']} configs run" if hits else ""))
    idle = summary.get("pool_idle")
    if idle:
        print(f"  pool idle, process-seconds: {idle['start_s']:.1f} starting ({idle['processes']} processes ready "
              f"{idle['ready_min_s']:.1f}-{idle['ready_max_s']:.1f} s in), {idle['between_s']:.1f} between configs, "
              f"{idle['tail_s']:.1f} in the tail")
        end = idle["last_finished"][-1]
        done = end["began_s"] + end["total_s"]
        print(f"  last to finish: began {end['began_s']:.1f} s in, ran {end['total_s']:.2f} s, "
              f"host_cost rank {end['host_cost_rank']} of {summary['configs']}; the sweep returned "
              f"{summary['wall_s'] - done:.1f} s after it (the parent storing what was left, the pool's shutdown)")
    mem = summary.get("memory")
    if mem:
        print(f"  resident memory per process (MiB): peak up to {mem['peak_max_mb']:.0f} ({mem['peak_sum_mb'] / 1024:.1f} GiB "
              f"summed over {mem['processes']}); between configs up to {mem['between_max_mb']:.0f} "
              f"({mem['between_sum_mb'] / 1024:.1f} GiB summed)")
    if summary["prewarm"]:
        w = summary["prewarm"]
        print(f"  (compile cache warmed first, not timed: {w['variants']} variants, {w['wall_s']:.1f} s)")
    print(f"  {'phase':22s} {'sum s':>10s} {'share':>7s} {'s/config':>10s}")
    for label, secs in summary["phases_s"].items():
        print(f"  {label:22s} {secs:10.2f} {summary['phases_share'][label]:7.1%} {summary['per_config_s'][label]:10.4f}")
        if label == "transfers+kernel":
            for inner, secs_in in summary["inside_run_s"].items():
                print(f"  {'  ' + inner:22s} {secs_in:10.2f}")
    print(f"  {'size quartile':14s} {'configs':>7s} {'flops <=':>10s} {'total s':>9s} {'median':>9s}"
          f" {'inputs':>8s} {'run':>8s} {'ref':>8s} {'verify':>8s}")
    for row in summary["by_size"]:
        print(f"  {row['quartile']:<14d} {row['configs']:7d} {row['flops_max']:10.2e} {row['total_s_mean']:9.4f}"
              f" {row['total_s_median']:9.4f} {row['inputs_s_mean']:8.4f} {row['run_wall_s_mean']:8.4f}"
              f" {row['reference_s_mean']:8.4f} {row['verify_s_mean']:8.4f}")


def unshipped_copy() -> KernelSource:
    """The shipped kernels/src (host_emu.h included, as a commit's bundle has it) with a comment
    added: the same kernels, but a source that did not ship, so it runs confined."""
    files = {**local_source().files, "host_emu.h": (SRC_DIR / "host_emu.h").read_text()}
    files["attention.hip"] += "\n// bench/sweep.py --confined: a copy that runs confined\n"
    return KernelSource.from_files(files)


def _env_pair(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"--baseline-env: {text!r} is not VAR=VALUE")
    return name, value


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda", help="cpu, cuda, hip or auto (default cuda)")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=_cores(), help="worker processes (default: all cores)")
    parser.add_argument("--db", help="database URL (default: a fresh SQLite file in a temp folder)")
    parser.add_argument("--cache-dir", help="compile cache folder of the warm run (default: a fresh temp folder)")
    parser.add_argument("--skip-cold", action="store_true", help="only the warm-cache run")
    parser.add_argument("--baseline-env", action="append", default=[], metavar="VAR=VALUE", type=_env_pair,
                        help="also run the warm sweep with these variables set (repeatable) and print "
                             "the ratio: a change measured against what it replaced in one run")
    parser.add_argument("--ranges", type=json.loads, default={},
                        help='sampled ranges to override, as POST /sweeps takes them: \'{"seq_len_k": [1, 256]}\' '
                             "(hostemu emulates every GPU thread: keep its configs small)")
    parser.add_argument("--confined", action="store_true",
                        help="also run the warm sweep with every kernel confined, as a fetched commit's, and print "
                             "the ratio to the warm run: the confinement's cost")
    parser.add_argument("--repeat", action="store_true",
                        help="run the warm sweep's configs a second time and report its configs/s: a repeated "
                             "sweep, its inputs and references from the data cache the first run filled")
    parser.add_argument("--data-cache", type=Path,
                        help="data cache folder (sweeps/datacache.py; with --repeat and none named: a fresh temp "
                             "folder; neither: no data cache)")
    parser.add_argument("--data-cache-bytes", type=int, help="the data cache's bound (default: the setting's)")
    parser.add_argument("--out", type=Path, default=Path("sweep-bench.json"))
    args = parser.parse_args(argv)
    baseline_env = dict(args.baseline_env)

    tmp = tempfile.TemporaryDirectory(prefix="attnsweep-bench-")
    db_url = args.db or f"sqlite:///{tmp.name}/bench.db"
    if args.cache_dir or "ATTNSWEEP_KERNEL_CACHE" not in os.environ:
        os.environ["ATTNSWEEP_KERNEL_CACHE"] = args.cache_dir or f"{tmp.name}/kernels"
    caching = bool(args.repeat or args.data_cache)
    os.environ.pop("ATTNSWEEP_DATA_CACHE", None)
    if caching:
        os.environ["ATTNSWEEP_DATA_CACHE"] = str(args.data_cache or f"{tmp.name}/data")
    if args.data_cache_bytes is not None:
        os.environ["ATTNSWEEP_DATA_CACHE_BYTES"] = str(args.data_cache_bytes)
    cap_blas_threads()
    if args.jobs > 1:
        start_pool_server()  # as `attnsweep run` does before it plans the sweep
    upgrade(db_url)
    probe = get_backend(args.backend)
    info = probe.device_info()
    probe.close()
    spec = SweepSpec(samples=args.samples, seed=args.seed, backend=info.backend, ranges=args.ranges)
    print(f"backend {info.backend} on {info.device}; {args.samples} configs, seed {args.seed}, "
          f"jobs {args.jobs}, compile cache {os.environ['ATTNSWEEP_KERNEL_CACHE']}")

    summary: dict = {"backend": info.backend, "device": info.device, "samples": args.samples,
                     "seed": args.seed, "jobs": args.jobs, "target_configs_per_s": 50}
    def fresh(name: str, env: dict[str, str] | None = None) -> dict[str, str]:
        # Every run but the repeat starts with an empty data cache of its own, as a sweep of new
        # configs does: A-B-A comparisons and the cold run measure the same work as the first run.
        fresh_cache = caching and not args.data_cache
        return {**(env or {}), **({"ATTNSWEEP_DATA_CACHE": f"{tmp.name}/data-{name}"} if fresh_cache else {})}

    summary["warm"] = run_once(db_url, spec, info.backend, args.jobs, info.total_memory, {}, warm_first=True)
    print_run("warm compile cache", summary["warm"])
    if args.repeat:
        summary["repeat"] = run_once(db_url, spec, info.backend, args.jobs, info.total_memory, {}, warm_first=False)
        print_run("repeated: the same configs again (data cache filled by the run above)", summary["repeat"])
        rate = summary["warm"]["configs_per_s"]
        print(f"\nrepeated sweep: {summary['repeat']['configs_per_s']:.1f} configs/s, "
              f"{summary['repeat']['configs_per_s'] / rate if rate else 0.0:.2f}x the first run's {rate:.1f}")
    if baseline_env:
        label = " ".join(f"{k}={v}" for k, v in baseline_env.items())
        summary["baseline_env"] = baseline_env
        summary["baseline"] = run_once(db_url, spec, info.backend, args.jobs, info.total_memory, fresh("baseline", baseline_env),
                                       warm_first=False)
        print_run(f"warm compile cache, baseline {label}", summary["baseline"])
        # Then the change again: the host drifts between runs (the same sweep's worker time
        # has varied by 15% from one machine to the next), so the baseline is compared with
        # the mean of the runs before and after it.
        summary["warm_again"] = run_once(db_url, spec, info.backend, args.jobs, info.total_memory, fresh("again"),
                                         warm_first=False)
        print_run("warm compile cache, again", summary["warm_again"])
        summary["ab"] = ab = compare_runs([summary["warm"], summary["warm_again"]], summary["baseline"])
        print(f"\nwarm / baseline ({label}), the two warm runs' mean: {ab['throughput']:.2f}x throughput; "
              f"worker seconds per config {ab['worker_s']:.3f} vs {ab['baseline_worker_s']:.3f}; by phase "
              + ", ".join(f"{p} {r:.2f}x" for p, r in ab["phase_speedup"].items()))
    if args.confined:
        summary["confined"] = run_once(db_url, spec, info.backend, args.jobs, info.total_memory, fresh("confined"),
                                       warm_first=True,
                                       source=unshipped_copy())
        print_run("warm compile cache, every kernel confined", summary["confined"])
        summary["confined_ab"] = ab = compare_runs([summary["confined"]], summary["warm"])
        print(f"\nconfined / warm: {ab['throughput']:.3f}x throughput ({1 - ab['throughput']:+.1%} cost); worker "
              f"seconds per config {ab['worker_s']:.4f} vs {ab['baseline_worker_s']:.4f}; by phase, warm / confined: "
              + ", ".join(f"{p} {r:.2f}x" for p, r in ab["phase_speedup"].items()))
    if not args.skip_cold:
        summary["cold"] = run_once(db_url, spec, info.backend, args.jobs, info.total_memory,
                                   fresh("cold", {"ATTNSWEEP_KERNEL_CACHE_DISABLE": "1"}), warm_first=False)
        print_run("compile cache disabled", summary["cold"])
        cold_rate = summary["cold"]["configs_per_s"]
        summary["warm_over_cold"] = summary["warm"]["configs_per_s"] / cold_rate if cold_rate else None
        print(f"\nwarm / cold throughput: {summary['warm_over_cold']:.2f}x")
    met = summary["warm"]["configs_per_s"] >= 50
    print(f"target (>= 50 configs/s warm): {'met' if met else 'not met'} "
          f"({summary['warm']['configs_per_s']:.1f} configs/s)")
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary written to {args.out}")
    tmp.cleanup()
    return summary


if __name__ == "__main__":
    main()
