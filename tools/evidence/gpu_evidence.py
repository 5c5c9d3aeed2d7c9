"""GPU evidence for the kernels, one script, steps run in the order given:

  sweep      a sweep of --sweep configs at the default distribution: outcome counts,
             not-applicable reasons, configs/s (target: zero fail, nan, error);
  calibrate  another --calibrate configs (another seed; --part names a piece, so the
             calibration can be spread over several runs of at most 10 minutes each);
  defects    each defect switch alone, a sweep of --defect-samples configs: caught or not;
  regime-defects  each defect switch of --regime-defects in three sweeps of --defect-samples
             configs, one seed: `normal` inputs alone, the regime mix (sweeps.regime_mix.REGIME_MIX)
             and the mix steered by coverage (--coverage-guided): configs caught in each;
  sdpa       our final outputs against torch's scaled_dot_product_attention on the GPU;
  pool       worst row_err and LSE error per dtype over every metrics-*.csv.gz in --out (and
             --pool-from folders), beside the bound table of sweeps/policy.py: the margin
             (bound / worst) must be 2x or more, with zero false failures.

Every sweep runs through `attnsweep run` itself (embedded store, a local process pool), so what
is measured is what users run; each writes metrics-<name>.csv.gz (one line per config) for
pooling. Prints tables, writes evidence-<steps>.json in --out.

    python tools/evidence/gpu_evidence.py --steps sweep,defects,sdpa --sweep 2000 --jobs 16 --out $OUT
    python tools/evidence/gpu_evidence.py --steps calibrate --calibrate 4000 --part 1 --out $OUT
    python tools/evidence/gpu_evidence.py --steps pool --out RUN_DIR --pool-from OTHER_RUN_DIR
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attnconfig.outcomes import OUTCOMES  # noqa: E402
from kernels.backends.base import NUMERIC_DEFECTS  # noqa: E402
from sweeps.policy import GATE_BOUNDS  # noqa: E402

METRIC_COLUMNS = ("config_hash", "dtype", "head_dim_v", "split_kv", "causal", "data_regime", "outcome", "failed_gate",
                  "out_row_err", "lse_max_abs", "out_rms", "out_nonfinite", "variant")


def attnsweep_run(out: Path, name: str, *args: str) -> dict:
    db, report = out / f"{name}.db", out / f"{name}.json"
    for p in (db, report):
        p.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cli", "run", "--db", str(db), "--report-json", str(report), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    # Exit status 1 is a sweep with failing configs, which a defect sweep is meant to be.
    if proc.returncode not in (0, 1) or not report.exists():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    rep = json.loads(report.read_text())
    rep["elapsed_s"] = time.perf_counter() - t0
    export_metrics(db, out / f"metrics-{name}.csv.gz")
    # The CSV keeps what the evidence needs; a GPU machine's run returns 8 files at most, so the
    # database goes, with SQLite's -wal and -shm files.
    for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), report):
        p.unlink(missing_ok=True)
    return rep


def export_metrics(db: Path, dest: Path) -> None:
    con = sqlite3.connect(db)
    rows = con.execute(f"SELECT {', '.join(METRIC_COLUMNS)} FROM config_runs ORDER BY seq").fetchall()
    with gzip.open(dest, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(METRIC_COLUMNS)
        w.writerows(rows)


def read_metrics(paths: list[Path]) -> list[dict]:
    rows = []
    for p in paths:
        with gzip.open(p, "rt", newline="") as f:
            for r in csv.DictReader(f):
                r["source"] = p.name
                rows.append(r)
    return rows


def fnum(x: str) -> float:
    return float(x) if x not in ("", "None") else math.nan


def print_failures(rows: list[dict], limit: int = 8) -> None:
    bad = [r for r in rows if r["outcome"] not in ("pass", "not_applicable")]
    for r in bad[:limit]:
        print(f"  {r['outcome']:8} gate={r['failed_gate']} {r['dtype']} Dv={r['head_dim_v']} split={r['split_kv']} "
              f"row_err={fnum(r['out_row_err']):.2e} lse={fnum(r['lse_max_abs']):.2e} {r['variant']}")


def step_sweep(a, common) -> dict:
    rep = attnsweep_run(a.out, "sweep", "--samples", str(a.sweep), "--seed", str(a.seed), "--label", "gpu-sweep",
                        *common, *a.sweep_arg)
    space = " ".join(a.sweep_arg) or "default distribution"
    print(f"\n== sweep: {rep['configs_run']} configs, {space}, seed {a.seed}, {rep['device']}")
    print(f"outcomes {rep['outcomes']}")
    print(f"not applicable {rep['not_applicable_reasons']}; prefilter rejections {rep.get('filtered')}")
    print(f"{rep['configs_per_s']:.1f} configs/s ({rep['wall_s']:.0f} s, {a.jobs} processes)")
    print_failures(read_metrics([a.out / "metrics-sweep.csv.gz"]))
    return rep


def step_calibrate(a, common) -> dict:
    name = f"calibrate-{a.part}"
    seed = a.seed + 1000 * a.part
    rep = attnsweep_run(a.out, name, "--samples", str(a.calibrate), "--seed", str(seed), "--label", name, *common)
    print(f"\n== {name}: {rep['configs_run']} configs, seed {seed}: outcomes {rep['outcomes']}, "
          f"{rep['configs_per_s']:.1f} configs/s")
    return rep


def step_defects(a, common) -> dict:
    res = {}
    print(f"\n== defect switches, {a.defect_samples} configs each (default distribution, seed {a.seed + 2})")
    for d in sorted(NUMERIC_DEFECTS):
        rep = attnsweep_run(a.out, f"defect-{d}", "--samples", str(a.defect_samples), "--seed", str(a.seed + 2),
                            "--defect", d, *common)
        o = rep["outcomes"]
        res[d] = o
        print(f"{d:24} fail={o['fail']:4d} nan={o['nan']:4d} pass={o['pass']:4d} error={o['error']} "
              f"-> {'CAUGHT' if o['fail'] + o['nan'] else 'MISSED'}")
    return res


def regime_modes() -> dict[str, list[str]]:
    from sweeps.regime_mix import REGIME_MIX

    mix = ",".join(f"{r}={share:g}" for r, share in REGIME_MIX.items())
    return {"normal": ["--regimes", "normal"], "mixed": ["--regimes", mix],
            "guided": ["--regimes", mix, "--coverage-guided"]}


def step_regime_defects(a, common) -> dict:
    res: dict = {}
    modes = regime_modes()
    seed = a.seed + 2
    print(f"\n== defect switches with and without data regimes, {a.defect_samples} configs a sweep, seed {seed}")
    print(f"{'defect':24}" + "".join(f"{m:>22}" for m in modes))
    for d in a.regime_defects.split(","):
        res[d] = {}
        for mode, args in modes.items():
            rep = attnsweep_run(a.out, f"{d}-{mode}", "--samples", str(a.defect_samples), "--seed", str(seed),
                                "--defect", d, "--no-triage", *args, *common)
            o = rep["outcomes"]
            res[d][mode] = {"caught": sum(n for k, n in o.items() if k not in ("pass", "not_applicable")),
                            "outcomes": o, "configs": rep["configs_run"]}
        print(f"{d:24}" + "".join(f"{res[d][m]['caught']:>13} of {res[d][m]['configs']:<5}" for m in modes), flush=True)
    return res


def step_sdpa(a) -> list[dict]:
    """Final outputs of our cuda backend against torch SDPA (an oracle nobody here wrote)."""
    import numpy as np

    from tools.evidence.gpu_suite import gpu_suite
    from kernels.backends.cuda import CudaBackend
    from reference import make_inputs

    backend = CudaBackend()
    res = []
    print("\n== torch scaled_dot_product_attention vs ours (max |ours - torch| / max |torch|)")
    cases = gpu_suite()
    for c in cases.SDPA_CASES + cases.SDPA_EXTRA_CASES:
        inputs = make_inputs(c)
        prepared = backend.prepare(c)
        ours = backend.run(prepared, c, inputs).out.astype(np.float32)
        theirs = cases.sdpa_reference(c, inputs)
        err = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-6))
        res.append({"config": json.loads(c.to_json()), "variant": prepared.variant, "rel_err": err})
        print(f"  {c.dtype:4} g={c.g} hq={c.num_heads_q} hkv={c.num_heads_kv} sq={c.seq_len_q} sk={c.seq_len_k} "
              f"d={c.head_dim_qk}/{c.head_dim_v} causal={c.causal} split={c.split_kv} {prepared.variant}: {err:.1e}")
    return res


def step_pool(a) -> dict:
    files = sorted(a.out.glob("metrics-calibrate-*.csv.gz")) + sorted(a.out.glob("metrics-sweep.csv.gz"))
    for d in a.pool_from:
        files += sorted(Path(d).glob("metrics-calibrate-*.csv.gz")) + sorted(Path(d).glob("metrics-sweep.csv.gz"))
    rows = read_metrics(files)
    judged = [r for r in rows if r["outcome"] in ("pass", "fail", "nan")]
    false_fail = [r for r in judged if r["outcome"] != "pass"]
    print(f"\n== calibration pool: {len(rows)} configs from {len(files)} sweeps ({', '.join(f.name for f in files)})")
    print("outcomes: " + ", ".join(f"{o}={sum(r['outcome'] == o for r in rows)}" for o in
                                    OUTCOMES))
    print(f"{'dtype':6} {'n':>6} {'worst row_err':>14} {'bound':>10} {'margin':>7} {'worst lse_abs':>14} {'bound':>10} {'margin':>7}")
    table = {}
    for dtype in sorted({r["dtype"] for r in judged}):
        rs = [r for r in judged if r["dtype"] == dtype and int(r["out_nonfinite"] or 0) == 0]
        wr = max((fnum(r["out_row_err"]) for r in rs if not math.isnan(fnum(r["out_row_err"]))), default=0.0)
        wl = max((fnum(r["lse_max_abs"]) for r in rs if not math.isnan(fnum(r["lse_max_abs"]))), default=0.0)
        b = GATE_BOUNDS[dtype]
        mr = b["row_err"] / wr if wr else math.inf
        ml = b["lse_max_abs"] / wl if wl else math.inf
        table[dtype] = {"n": len(rs), "worst_row_err": wr, "row_bound": b["row_err"], "row_margin": mr,
                        "worst_lse_abs": wl, "lse_bound": b["lse_max_abs"], "lse_margin": ml}
        print(f"{dtype:6} {len(rs):6d} {wr:14.3e} {b['row_err']:10.2e} {mr:7.1f} {wl:14.3e} {b['lse_max_abs']:10.2e} {ml:7.1f}")
    print(f"false failures (fail/nan of the correct kernels): {len(false_fail)}")
    print_failures(false_fail)
    return {"configs": len(rows), "files": [f.name for f in files], "table": table, "false_failures": len(false_fail)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="sweep,calibrate,defects,sdpa,pool")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--sweep", type=int, default=2000)
    ap.add_argument("--calibrate", type=int, default=10000)
    ap.add_argument("--part", type=int, default=1)
    ap.add_argument("--defect-samples", type=int, default=300)
    ap.add_argument("--regime-defects", default=",".join(sorted(NUMERIC_DEFECTS)),
                    help="the defect switches of the regime-defects step, comma-separated")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--pool-from", action="append", default=[])
    ap.add_argument("--sweep-arg", action="append", default=[],
                    help="passed on to the sweep step's `attnsweep run`, e.g. --sweep-arg=--range=trans_k=0")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    common = ["--backend", a.backend, "--jobs", str(a.jobs)]
    steps = [s for s in a.steps.split(",") if s]
    summary: dict = {}
    for step in steps:
        t0 = time.perf_counter()
        if step == "sweep":
            summary["sweep"] = step_sweep(a, common)
        elif step == "calibrate":
            summary[f"calibrate-{a.part}"] = step_calibrate(a, common)
        elif step == "defects":
            summary["defects"] = step_defects(a, common)
        elif step == "regime-defects":
            summary["regime-defects"] = step_regime_defects(a, common)
        elif step == "sdpa":
            summary["sdpa"] = step_sdpa(a)
        elif step == "pool":
            summary["pool"] = step_pool(a)
        else:
            raise SystemExit(f"--steps: unknown step {step!r}")
        print(f"({step}: {time.perf_counter() - t0:.0f} s)", flush=True)
    (a.out / f"evidence-{'-'.join(steps)}.json").write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
