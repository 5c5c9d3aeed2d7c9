"""Evidence on a GPU that faults stay with their configs: default sweeps with each fault defect.

    python3 tools/evidence/fault_evidence.py sweeps --samples 300 --seed 7 --jobs 16 --out DIR
    python3 tools/evidence/fault_evidence.py sanitize --samples 300 --share 0.4 --seed 7 --jobs 16 --out DIR

`sweeps` runs `attnsweep run --backend cuda` on the same sampled configs without a defect and
with each of oob_store, oob_store_small, missing_barrier and hang (the last with --time-limit),
then prints, per sweep, the configs stored and distinct, the outcomes, and whether the configs
off the faulting path (the combine kernel: split_kv > 1) came out as in the clean sweep.
`sanitize` runs the correct kernels under memcheck and racecheck and missing_barrier under
racecheck, on a stratified share of the same configs, and prints the outcomes and the first
finding. Each sweep's SQLite database stays in DIR.
"""
from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_sweep(out: Path, name: str, args: argparse.Namespace, *extra: str) -> tuple[Path, float]:
    db = out / f"{name}.db"
    db.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "cli", "run", "--backend", args.backend, "--samples", str(args.samples),
            "--seed", str(args.seed), "--jobs", str(args.jobs), "--db", str(db),
            *(f"--range={r}" for r in args.range), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        print(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return db, wall


def rows_of(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("select config_hash, outcome, split_kv, attempts, state, detail, variant "
                            "from config_runs").fetchall()


def summary(name: str, db: Path, wall: float, clean: dict[str, str] | None) -> dict[str, str]:
    rows = rows_of(db)
    outcomes = {h: o for h, o, *_ in rows}
    counts = Counter(outcomes.values())
    once = all(state == "done" and attempts == 1 for _h, _o, _s, attempts, state, _d, _v in rows)
    line = (f"{name:18} stored {len(rows):4d} distinct {len(outcomes):4d} once {str(once):5} "
            f"{wall:6.1f} s  " + " ".join(f"{o}={n}" for o, n in sorted(counts.items())))
    if clean is not None:
        path = {h for h, _o, split_kv, *_ in rows if split_kv > 1}
        off = {h for h in outcomes if h not in path}
        same_off = sum(outcomes[h] == clean.get(h) for h in off)
        on_counts = Counter(outcomes[h] for h in path)
        line += (f"\n{'':18} faulting path (split_kv > 1): {len(path)} configs: "
                 + " ".join(f"{o}={n}" for o, n in sorted(on_counts.items()))
                 + f"; off it: {same_off}/{len(off)} as in the clean sweep")
        firsts = [d for _h, o, _s, _a, _st, d, _v in rows if o in ("fault", "timeout", "error", "unsafe") and d]
        if firsts:
            line += f"\n{'':18} e.g. {firsts[0].splitlines()[0][:300]}"
    print(line, flush=True)
    return outcomes


def cmd_sweeps(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"== {args.samples}-config default sweeps, seed {args.seed}, --jobs {args.jobs}, backend {args.backend}")
    db, wall = run_sweep(out, "clean", args)
    clean = summary("clean", db, wall, None)
    for defect in args.defects:
        extra = ["--defect", defect]
        if defect == "hang":
            extra += ["--time-limit", str(args.hang_limit)]
        db, wall = run_sweep(out, defect, args, *extra)
        summary(defect, db, wall, clean)


def cmd_sanitize(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"== {args.samples}-config sweeps, seed {args.seed}, ranges {args.range or 'default'}, sanitize share "
          f"{args.share}, --jobs {args.jobs}")
    for name, tool, defect in args.runs:
        extra = ["--sanitize", tool, "--sanitize-share", str(args.share), "--time-limit", str(args.limit)]
        if defect:
            extra += ["--defect", defect]
        db, wall = run_sweep(out, name, args, *extra)
        rows = rows_of(db)
        sanitized = [r for r in rows if r[5] and f"compute-sanitizer {tool}" in r[5]]
        counts = Counter(r[1] for r in sanitized)
        print(f"{name:26} {len(rows)} configs, {len(sanitized)} sanitized ({len({r[6] for r in sanitized})} variants), "
              f"{wall:.0f} s: " + " ".join(f"{o}={n}" for o, n in sorted(counts.items())), flush=True)
        unsafe = [r for r in sanitized if r[1] == "unsafe"]
        if unsafe:
            print("    first finding: " + " | ".join(unsafe[0][5].splitlines()[:4])[:600], flush=True)
            (out / f"{name}-finding.txt").write_text(unsafe[0][5])
        plain = Counter(r[1] for r in rows if r not in sanitized)
        print(f"    not sanitized: " + " ".join(f"{o}={n}" for o, n in sorted(plain.items())), flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("sweeps", "sanitize"):
        p = sub.add_parser(name)
        p.add_argument("--samples", type=int, default=300)
        p.add_argument("--backend", default="cuda")
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--jobs", type=int, default=16)
        p.add_argument("--out", default="out/faults")
        p.add_argument("--timeout", type=float, default=400, help="seconds one sweep may take")
        p.add_argument("--range", action="append", default=[], help="FIELD=LO:HI, passed to attnsweep run")
    sub.choices["sweeps"].add_argument("--defects", nargs="*", default=["oob_store", "oob_store_small",
                                                                         "missing_barrier", "hang"])
    sub.choices["sweeps"].add_argument("--hang-limit", type=float, default=5)
    sub.choices["sanitize"].add_argument("--share", type=float, default=0.4)
    sub.choices["sanitize"].add_argument("--limit", type=float, default=30, help="--time-limit (x10 under a sanitizer)")
    sub.choices["sanitize"].add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "sweeps":
        cmd_sweeps(args)
    else:
        runs = [("clean-memcheck", "memcheck", None), ("clean-racecheck", "racecheck", None),
                ("missing_barrier-racecheck", "racecheck", "missing_barrier")]
        args.runs = [r for r in runs if args.only is None or r[0] in args.only]
        cmd_sanitize(args)


if __name__ == "__main__":
    main()
