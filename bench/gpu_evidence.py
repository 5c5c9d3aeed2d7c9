"""GPU evidence for the kernels, in one run on the GPU machine (issue 4).

1. calibration: a sweep of N configs at the default distribution on the given backend; from
   the stored metrics of every config whose outputs are finite, the worst `out_row_err` and
   `lse_max_abs` per dtype, the bound table in sweeps/policy.py beside them and the margin
   (bound / worst; the SPEC asks for 2x or more);
2. a sweep of M configs (another seed): outcome counts, not-applicable reasons, configs/s;
3. each defect switch alone: a sweep of at most 300 configs; the outcomes it reports.

Each sweep runs through `attnsweep run` itself (embedded store, local process pool), so what is
measured is what users run. Prints tables; writes JSON beside the SQLite files in --out.

    python bench/gpu_evidence.py --backend cuda --calibrate 10000 --sweep 2000 --jobs 16 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.backend import DEFECTS  # noqa: E402
from sweeps.policy import GATE_BOUNDS  # noqa: E402


def attnsweep_run(out: Path, name: str, *args: str) -> dict:
    db, report = out / f"{name}.db", out / f"{name}.json"
    for p in (db, report):
        p.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cli", "run", "--db", str(db), "--report-json", str(report), *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{name}.log").write_text(proc.stdout + "\n" + proc.stderr[-20000:])
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    rep = json.loads(report.read_text())
    rep["elapsed_s"] = time.perf_counter() - t0
    rep["db"] = str(db)
    return rep


def worst_metrics(db: str) -> dict[str, dict[str, float]]:
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT dtype, MAX(out_row_err), MAX(lse_max_abs), MAX(out_rms), COUNT(*) FROM config_runs "
        "WHERE outcome IN ('pass', 'fail') AND out_nonfinite = 0 GROUP BY dtype"
    ).fetchall()
    return {d: {"row_err": r or 0.0, "lse_max_abs": l or 0.0, "rms": m or 0.0, "n": n} for d, r, l, m, n in rows}


def failures(db: str, limit: int = 5) -> list[tuple]:
    con = sqlite3.connect(db)
    return con.execute(
        "SELECT outcome, failed_gate, dtype, split_kv, seq_len_k, causal, detail, reproducer FROM config_runs "
        "WHERE outcome NOT IN ('pass', 'not_applicable') ORDER BY seq LIMIT ?", (limit,)
    ).fetchall()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--calibrate", type=int, default=10000)
    ap.add_argument("--sweep", type=int, default=2000)
    ap.add_argument("--defect-samples", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--skip", default="", help="comma list of steps to skip: calibrate,sweep,defects")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    common = ["--backend", a.backend, "--jobs", str(a.jobs)]
    summary: dict = {}

    if "calibrate" not in skip and a.calibrate:
        rep = attnsweep_run(a.out, "calibrate", "--samples", str(a.calibrate), "--seed", str(a.seed), "--label", "calibration", *common)
        worst = worst_metrics(rep["db"])
        summary["calibration"] = {"report": rep, "worst": worst}
        print(f"\n== calibration: {rep['configs_run']} configs on {rep['device']}, {rep['configs_per_s']:.1f} configs/s")
        print(f"outcomes {rep['outcomes']}  not applicable {rep['not_applicable_reasons']}")
        print(f"{'dtype':6} {'n':>6} {'worst row_err':>14} {'bound':>10} {'margin':>8} {'worst lse_abs':>14} {'bound':>10} {'margin':>8} {'worst rms':>10}")
        for dtype, w in sorted(worst.items()):
            b = GATE_BOUNDS[dtype]
            mr = b["row_err"] / w["row_err"] if w["row_err"] else math.inf
            ml = b["lse_max_abs"] / w["lse_max_abs"] if w["lse_max_abs"] else math.inf
            print(f"{dtype:6} {w['n']:6d} {w['row_err']:14.3e} {b['row_err']:10.2e} {mr:8.1f} {w['lse_max_abs']:14.3e} {b['lse_max_abs']:10.2e} {ml:8.1f} {w['rms']:10.2e}")
        for f in failures(rep["db"]):
            print("  failure:", f[:6], f[6][:200] if f[6] else "", "\n   ", f[7][:300])

    if "sweep" not in skip and a.sweep:
        rep = attnsweep_run(a.out, "sweep", "--samples", str(a.sweep), "--seed", str(a.seed + 1), "--label", "gpu-sweep", *common)
        summary["sweep"] = rep
        print(f"\n== sweep: {rep['configs_run']} configs, default distribution, seed {rep['seed']}, {rep['device']}")
        print(f"outcomes {rep['outcomes']}")
        print(f"not applicable {rep['not_applicable_reasons']}; filtered {rep['filtered']}")
        print(f"{rep['configs_per_s']:.1f} configs/s ({rep['wall_s']:.0f} s, {a.jobs} processes)")
        for f in failures(rep["db"]):
            print("  failure:", f[:6], f[6][:200] if f[6] else "", "\n   ", f[7][:300])

    if "defects" not in skip and a.defect_samples:
        summary["defects"] = {}
        print(f"\n== defect switches, {a.defect_samples} configs each (default distribution, seed {a.seed + 2})")
        for d in DEFECTS:
            rep = attnsweep_run(a.out, f"defect_{d}", "--samples", str(a.defect_samples), "--seed", str(a.seed + 2), "--defect", d, *common)
            summary["defects"][d] = rep["outcomes"]
            caught = rep["outcomes"]["fail"] + rep["outcomes"]["nan"]
            print(f"{d:24} fail={rep['outcomes']['fail']:4d} nan={rep['outcomes']['nan']:4d} pass={rep['outcomes']['pass']:4d} "
                  f"error={rep['outcomes']['error']} -> {'CAUGHT' if caught else 'MISSED'}")
    (a.out / "evidence.json").write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
