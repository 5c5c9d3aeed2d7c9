"""Per-regime sweeps of one backend: outcome counts and gate margins per regime and dtype.

For each data regime (attnconfig.regimes) a sweep of --samples configs of that regime alone is
run through `attnsweep run` (the default distribution otherwise, one seed; the embedded store,
its process pool and thread caps, as users run it) and read back from its SQLite file. Printed
per regime and dtype: configs, pass / fail / nan / other outcomes, and the gate margins: the
largest observed metric over its bound (out_rms / rms, out_row_err / row, lse_max_abs / lse,
partials_row_err / row); a margin above 1 is a failure, and a calibration wants the worst
margin of a correct kernel at 0.5 or less. Writes results.jsonl.gz (one line per config),
summary.json, coverage.json (sweeps.coverage) and sweeps.log (the end of each sweep's output) in
--out: four files, under what a GPU machine's run returns.

    python3 tools/evidence/regimes.py --backend cuda --samples 2000 --jobs 16 --out DIR
    python3 tools/evidence/regimes.py --backend cpu --samples 300 --jobs 2 --out /tmp/regimes
"""
from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from attnconfig import DTYPES  # noqa: E402
from attnconfig.regimes import REGIMES  # noqa: E402

MARGINS = (("rms", "out_rms", "rms"), ("row", "out_row_err", "row"), ("lse", "lse_max_abs", "lse"),
           ("partials", "partials_row_err", "row"), ("partials_lse", "partials_lse_max_abs", "lse"))
METRICS = ("out_rms", "out_row_err", "out_max_abs", "lse_max_abs", "partials_row_err", "partials_lse_max_abs",
           "out_nonfinite", "lse_inf_mismatch")


def run_regime(backend: str, regime: str, samples: int, seed: int, dtypes: str, jobs: int, out: Path) -> list[dict]:
    """One regime's sweep through `attnsweep run`, read back from its SQLite file: a dict per config."""
    db = out / f"{regime}.db"
    db.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cli", "run", "--db", str(db), "--backend", backend, "--samples", str(samples),
           "--seed", str(seed), "--dtypes", dtypes, "--regimes", regime, "--jobs", str(jobs), "--no-triage",
           "--fail-on", "error"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    with open(out / "sweeps.log", "a") as log:
        log.write(f"== {regime}: {' '.join(cmd[3:])}\n{proc.stdout[-8000:]}{proc.stderr[-8000:]}\n")
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    rows = []
    for r in con.execute(f"SELECT config, outcome, failed_gate, detail, variant, gates, facts, {', '.join(METRICS)} "
                         "FROM config_runs ORDER BY seq"):
        metrics = {k: r[k] for k in METRICS} | (json.loads(r["facts"]) if r["facts"] else {})
        rows.append({"config": json.loads(r["config"]), "outcome": r["outcome"], "failed_gate": r["failed_gate"],
                     "detail": (r["detail"] or "")[:500], "variant": r["variant"],
                     "gates": json.loads(r["gates"]) if r["gates"] else None, "metrics": metrics})
    con.close()
    for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        p.unlink(missing_ok=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    """{regime: {dtype: {"configs", outcome counts, "margins": {gate: worst metric / bound}}}}."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"configs": 0, "outcomes": defaultdict(int), "margins": {}}))
    for row in rows:
        c = row["config"]
        cell = out[c.get("data_regime", "normal")][c["dtype"]]
        cell["configs"] += 1
        cell["outcomes"][row["outcome"]] += 1
        gates, metrics = row["gates"] or {}, row["metrics"]
        for name, metric, bound in MARGINS:
            if metrics.get(metric) is not None and gates.get(bound):
                m = float(metrics[metric]) / float(gates[bound])
                cell["margins"][name] = max(cell["margins"].get(name, 0.0), m)
    return json.loads(json.dumps(out))


def table(summary: dict) -> str:
    lines = [f"{'regime':<13}{'dtype':<6}{'n':>6}{'pass':>6}{'fail':>6}{'nan':>5}{'other':>6}  "
             + "  ".join(f"{n:>12}" for n, _, _ in MARGINS)]
    for regime in REGIMES:
        for dtype in DTYPES:
            cell = summary.get(regime, {}).get(dtype)
            if not cell:
                continue
            o = cell["outcomes"]
            other = cell["configs"] - o.get("pass", 0) - o.get("fail", 0) - o.get("nan", 0)
            margins = "  ".join(f"{cell['margins'][n]:>12.3g}" if n in cell["margins"] else f"{'-':>12}"
                                for n, _, _ in MARGINS)
            lines.append(f"{regime:<13}{dtype:<6}{cell['configs']:>6}{o.get('pass', 0):>6}{o.get('fail', 0):>6}"
                         f"{o.get('nan', 0):>5}{other:>6}  {margins}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--samples", type=int, default=300, help="configs per regime")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from sweeps.coverage import coverage_report, coverage_summary

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows: list[dict] = []
    with gzip.open(out / "results.jsonl.gz", "wt") as fh:
        for regime in a.regimes.split(","):
            got = run_regime(a.backend, regime, a.samples, a.seed, a.dtypes, a.jobs, out)
            rows += got
            fh.writelines(json.dumps(row, default=str) + "\n" for row in got)
            fh.flush()
            print(f"{regime}: {len(got)} configs, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    summary = summarize(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    report = coverage_report([(r["config"], r["outcome"], r["metrics"], r["variant"]) for r in rows],
                             paths=("mma", "grouped", "rowwise") if a.backend == "cuda" else ("grouped", "rowwise"))
    (out / "coverage.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    print(f"backend {a.backend}, seed {a.seed}, {len(rows)} configs in {time.time() - t0:.0f} s")
    print(table(summary))
    print(coverage_summary(report))
    failing = sum(1 for r in rows if r["outcome"] not in ("pass", "not_applicable"))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
