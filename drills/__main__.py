"""`make drills`: the service's dependencies die, as an operator would see it, and nothing is lost.

Starts everything it needs on free loopback ports, never the machine's own services (harness/):
a PostgreSQL cluster made with initdb in a temporary folder, a redis-server with AOF on (as in
docker-compose), the API (`attnsweep serve`) and two real Celery workers (`python -m cli worker
--queue cpu`). Then, one drill at a time, a sweep runs while something dies, and one table row
is printed per drill: configs stored, distinct, duplicated (written more than once), lost (never
stored), the sweep's final status and the recovery time (from the end of the disruption to the
sweep being done). Every wait is bounded; a drill that does not finish in time is reported as
such. The drills are listed in drills/basic.py, drills/outages.py (the infrastructure fails and
no outcome may change: each compared with a clean run of the same sweep) and docs/service.md
("Drills"). PostgreSQL's data lives on a small tmpfs of its own when run as root, so that a
drill can fill its disk.

`python -m drills [--only NAME,...] [--configs N] [--keep]`.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from drills.basic import DRILLS as BASIC
from drills.outages import NAMES as OUTAGES, Outages, drills as outage_drills, mount_pg_fs, unmount_pg_fs
from drills.stack import DrillService, Row, log
from harness import PostgresCluster, RedisServer

NAMES = [*BASIC, *OUTAGES]


def print_table(rows: list[Row]) -> None:
    print(f"| {'drill':<36} | configs | stored | distinct | duplicated | lost | status | recovery | note")
    print("|" + "-" * 38 + "|---------|--------|----------|------------|------|--------|----------|-----")
    for r in rows:
        rec = f"{r.recovery_s:.0f} s" if r.recovery_s is not None else "-"
        note = r.note
        if r.equal is not None:
            note = f"outcomes equal to the clean run: {r.equal[0]} of {r.equal[1]}" + (f"; {note}" if note else "")
        if r.failed:
            note = f"FAILED: {r.failed}; {note}"
        print(f"| {r.drill:<36} | {r.total:>7} | {r.stored:>6} | {r.distinct:>8} | {r.duplicated:>10} | {r.lost:>4} | "
              f"{r.status:<6} | {rec:>8} | {note}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help=f"comma-separated drills of: {', '.join(NAMES)}")
    parser.add_argument("--configs", type=int, default=150, help="configs per sweep")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, data)")
    args = parser.parse_args()
    chosen = [d.strip() for d in args.only.split(",") if d.strip()] or list(NAMES)
    unknown = [d for d in chosen if d not in NAMES]
    if unknown:
        parser.error(f"--only: unknown drill {unknown[0]!r}; one of {', '.join(NAMES)}")
    base = Path(tempfile.mkdtemp(prefix="attnsweep-drills-"))
    log(f"working in {base}")
    pg_fs = mount_pg_fs(base / "pgfs")
    # A small WAL, so that the tmpfs holds it: the disk-full drill fills what is left.
    pg = PostgresCluster(base / "pg", data=pg_fs / "data" if pg_fs else None,
                         settings={"max_wal_size": "64MB", "min_wal_size": "32MB"})
    redis_ = RedisServer(base / "redis")
    svc = DrillService(base, pg, redis_)
    drills: dict[str, Callable[[], Row]] = {**{name: (lambda fn=fn: fn(svc, args.configs)) for name, fn in BASIC.items()},
                                            **outage_drills(Outages(svc, args.configs, pg_fs))}
    rows: list[Row] = []
    stuck = 0
    try:
        pg.start()
        pg.createdb()
        redis_.start()
        subprocess.run(svc.stack.cli("db", "upgrade"), cwd=svc.stack.env["PYTHONPATH"], env=svc.env(), check=True,
                       capture_output=True)
        svc.start_api()
        svc.start_worker(0)
        svc.start_worker(1)
        svc.wait_workers_ready()
        log(f"PostgreSQL :{pg.port}, Redis :{redis_.port}, API :{svc.stack.api_port}, "
            f"workers {[w.name for w in svc.workers]}")
        for name in chosen:
            log(f"drill {name}")
            t0 = time.monotonic()
            try:
                row = drills[name]()
            except Exception as exc:  # noqa: BLE001 - a drill that breaks is a row that says so
                row = Row(name, status="error", note=f"{type(exc).__name__}: {exc}")
            log(f"drill {name}: {row} ({time.monotonic() - t0:.0f} s)")
            rows.append(row)
            svc.ensure_up()
        stuck = svc.db("SELECT count(*) FROM sweeps WHERE status IN ('queued', 'running')")[0][0]
    finally:
        svc.stack.stop()
        redis_.kill()
        pg.stop()
        unmount_pg_fs(pg_fs)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print_table(rows)
    print(f"sweeps left queued or running: {stuck}")
    return 1 if any(r.bad for r in rows) or stuck else 0


if __name__ == "__main__":
    sys.exit(main())
