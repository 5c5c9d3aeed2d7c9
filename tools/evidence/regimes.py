"""Per-regime sweeps of one backend: outcome counts and gate margins per regime and dtype.

For each data regime (attnconfig.regimes) a sweep of --samples configs of that regime alone is
drawn (the default distribution otherwise, one seed) and every config is run and judged as a
sweep judges it (sweeps.runner.run_config, the sweep policy's gates). Printed per regime and
dtype: configs, pass / fail / nan / other outcomes, and the gate margins: the largest observed
metric over its bound (out_rms / rms, out_row_err / row, lse_max_abs / lse,
partials_row_err / row); a margin above 1 is a failure, and a calibration wants the worst
margin of a correct kernel at 0.5 or less. Writes results.jsonl.gz (one line per config),
summary.json and coverage.json (sweeps.coverage) in --out.

    python3 tools/evidence/regimes.py --backend cuda --samples 2000 --out DIR
    python3 tools/evidence/regimes.py --backend cpu --samples 300 --jobs 2 --out /tmp/regimes
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from attnconfig import DTYPES, parse_config  # noqa: E402
from attnconfig.regimes import REGIMES  # noqa: E402

MARGINS = (("rms", "out_rms", "rms"), ("row", "out_row_err", "row"), ("lse", "lse_max_abs", "lse"),
           ("partials", "partials_row_err", "row"), ("partials_lse", "partials_lse_max_abs", "lse"))
_backend = None


def _run(args: tuple[str, dict]) -> dict:
    """One config in a pool process (the backend is built once per process)."""
    global _backend
    from kernels import get_backend
    from sweeps.runner import run_config

    name, config = args
    if _backend is None:
        _backend = get_backend(name)
    r = run_config(parse_config(config), _backend)
    return {"config": r.config.to_dict(), "outcome": r.outcome, "failed_gate": r.failed_gate, "detail": r.detail[:500],
            "variant": r.variant, "gates": r.gates, "metrics": r.metrics}


def _budget(backend: str) -> int:
    from sweeps.filters import splitkv_budget

    if backend in ("cpu", "hostemu"):
        return splitkv_budget(None, None)
    from kernels import get_backend

    return splitkv_budget(get_backend(backend).device_info().total_memory, None)


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
    from sweeps.sampler import sample
    from sweeps.spec import SweepSpec

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = _budget(a.backend)
    work = []
    for regime in a.regimes.split(","):
        spec = SweepSpec(samples=a.samples, seed=a.seed, backend=a.backend, dtypes=a.dtypes.split(","),
                         data_regimes=[regime])
        work += [(a.backend, c.to_dict()) for c in sample(spec, budget).configs]
    t0 = time.time()
    rows: list[dict] = []
    with gzip.open(out / "results.jsonl.gz", "wt") as fh, ProcessPoolExecutor(a.jobs) as pool:
        for i, row in enumerate(pool.map(_run, work, chunksize=4)):
            rows.append(row)
            fh.write(json.dumps(row, default=str) + "\n")
            if (i + 1) % 200 == 0:
                print(f"{i + 1}/{len(work)} configs, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
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
