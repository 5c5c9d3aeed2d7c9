"""`make security-drills`: the attacks of docs/security.md against a real API, a real Celery worker,
PostgreSQL and Redis of their own (harness/), and Chromium for the cross-site case.

Each attack is one table row: the attack, the service's answer, whether it was refused or
contained, and the outcome stored (for kernel code: its CI sweep's configs, each stored once).
After the attacks, every answer the API gave, every log line of its processes and every text a
client can read back from the store is searched for the deployment's secrets. Exit status 1 when
any row is not contained.

`python -m drills.security [--only NAME,...] [--keep]`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from drills.security.api_attacks import ATTACKS as API_ATTACKS, Row
from drills.security.kernel_attacks import ATTACKS as KERNEL_ATTACKS
from drills.security.stack import SecurityStack

ATTACKS = {a.__name__: a for a in (*API_ATTACKS, *KERNEL_ATTACKS)}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def print_table(rows: list[Row]) -> None:
    width = max(len(r.attack) for r in rows)
    print(f"| {'attack':<{width}} | answer | contained | stored outcome |")
    print(f"|{'-' * (width + 2)}|--------|-----------|----------------|")
    for r in rows:
        print(f"| {r.attack:<{width}} | {r.answer} | {'yes' if r.contained else '**NO**'} | {r.outcome} |", flush=True)


def secrets_row(s: SecurityStack) -> Row:
    places = {"answers": "\n".join(s.answers), "logs": s.logs(), "the store": s.stored_text()}
    found = {where: s.keys.found_in(text) for where, text in places.items()}
    leaks = {where: names for where, names in found.items() if names}
    return Row("a secret in any answer, log line or stored row", f"{len(s.answers)} answers searched",
               not leaks, ", ".join(f"{w}: {n}" for w, n in leaks.items()) or "none found")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m drills.security", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help=f"comma-separated attacks: {', '.join(ATTACKS)}")
    parser.add_argument("--keep", action="store_true", help="keep the folder of logs and data")
    args = parser.parse_args()
    chosen = [n for n in args.only.split(",") if n] or list(ATTACKS)
    unknown = sorted(set(chosen) - set(ATTACKS))
    if unknown:
        print(f"--only: unknown attack(s) {', '.join(unknown)}; known: {', '.join(ATTACKS)}", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="attnsweep-security-"))
    s = SecurityStack(base)
    rows: list[Row] = []
    try:
        log(f"starting PostgreSQL, Redis, the API and a worker in {base}")
        s.start()
        for name in chosen:
            log(f"attack: {name}")
            t0 = time.monotonic()
            try:
                row = ATTACKS[name](s)
            except Exception as exc:  # noqa: BLE001 - a drill that breaks is a row that did not hold
                row = Row(name, f"the drill broke: {type(exc).__name__}: {exc}"[:200], False)
            log(f"  {'contained' if row.contained else 'NOT CONTAINED'} in {time.monotonic() - t0:.0f} s: {row.outcome}")
            rows.append(row)
        rows.append(secrets_row(s))
    finally:
        s.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            log(f"kept {base}")
    print_table(rows)
    return 0 if all(r.contained for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
