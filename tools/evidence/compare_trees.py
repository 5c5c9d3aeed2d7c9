"""The same default sweep on two trees of the repository: outcomes compared config by config.

Runs `attnsweep run --samples N --seed S` in the old tree (--old, a checkout of an earlier
revision) and in this one, each into its own SQLite database, and compares the outcomes of the
configs both sweeps drew (by content hash). A config's hash is the same on both trees when its
fields are (the `normal` data regime is left out of the hash), so a sweep whose request adds
fields (the regime mix) still shares its `normal` configs with the old tree's. Extra arguments
after `--` go to the new tree's run only (e.g. `-- --regimes normal`).

    python3 tools/evidence/compare_trees.py --old OLD_TREE --backend cuda --samples 2000 --seed 1 \
        --jobs 16 --out DIR [-- EXTRA ...]
"""
from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def sweep(tree: Path, db: Path, args: argparse.Namespace, extra: list[str]) -> tuple[dict[str, tuple], float]:
    db.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "cli", "run", "--backend", args.backend, "--samples", str(args.samples),
            "--seed", str(args.seed), "--jobs", str(args.jobs), "--db", str(db), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=tree, capture_output=True, text=True, env=None)
    wall = time.perf_counter() - t0
    (db.with_suffix(".log")).write_text(proc.stdout + proc.stderr)
    if not db.exists():
        sys.exit(f"{tree}: no database (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    with sqlite3.connect(db) as conn:
        cols = {r[1] for r in conn.execute("pragma table_info(config_runs)")}
        regime = "data_regime" if "data_regime" in cols else "'normal'"
        rows = conn.execute(f"select config_hash, outcome, {regime}, config from config_runs").fetchall()
    return {h: (o, r, c) for h, o, r, c in rows}, wall


def line(name: str, rows: dict[str, tuple], wall: float) -> str:
    counts = Counter(o for o, _r, _c in rows.values())
    return f"{name:10} {len(rows):5d} configs {wall:6.1f} s  " + " ".join(f"{o}={n}" for o, n in sorted(counts.items()))


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("out/compare"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    old, old_wall = sweep(args.old.resolve(), args.out.resolve() / "old.db", args, [])
    print(line("old", old, old_wall), flush=True)
    new, new_wall = sweep(ROOT, args.out.resolve() / "new.db", args, extra)
    print(line("new", new, new_wall), flush=True)
    regimes = Counter(r for _o, r, _c in new.values())
    for regime in sorted(regimes):
        sub = {h: v for h, v in new.items() if v[1] == regime}
        print("  " + line(f"{regime}", sub, 0.0).replace("   0.0 s", ""), flush=True)
    shared = sorted(set(old) & set(new))
    differ = [h for h in shared if old[h][0] != new[h][0]]
    print(f"shared configs (same hash): {len(shared)}; same outcome {len(shared) - len(differ)}, "
          f"different {len(differ)}", flush=True)
    for h in differ[:20]:
        print(f"  {h} old={old[h][0]} new={new[h][0]} {old[h][2]}", flush=True)


if __name__ == "__main__":
    main()
