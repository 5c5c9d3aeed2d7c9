"""`attnsweep kernels` (the kernels this installation can sweep) and `attnsweep compare` (sweeps
of several kernels side by side). Registered on the main app by cli/main.py, like cli/triage.py."""
from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli.common import db_source, existing_database, fail

app = typer.Typer()


@app.command("kernels")
def kernels(as_json: bool = typer.Option(False, "--json", help="print the list as JSON")) -> None:
    """The kernels `--kernel` can name: attnsweep's own, the plug-ins that ship, and the entry
    points (group attnsweep.kernels) of installed packages; besides, module:attr,
    path/file.py:attr and so:PATH. A kernel that did not ship runs confined."""
    from kernels.plugins import discover

    rows = discover()
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="kernels (--kernel NAME)")
    for column in ("name", "from", "runs"):
        table.add_column(column, overflow="fold")
    for r in rows:
        where = r["value"] + (f" ({r['package']})" if r.get("package") else "")
        table.add_row(r["name"], where, "in the worker" if r["trusted"] else "confined")
    Console().print(table)


def _ratio(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"


@app.command("compare")
def compare(
    sweeps: list[int] = typer.Argument(..., help="sweep ids: the same seed and distribution on several kernels"),
    db: Optional[str] = typer.Option(None, "--db", help="SQLite path or database URL (default: ATTNSWEEP_DATABASE_URL, "
                                                        "else ./attnsweep.db)"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON"),
    limit: int = typer.Option(20, "--limit", min=0, help="configs failing on one kernel only to list"),
) -> None:
    """Sweeps of several kernels side by side: outcomes by kernel, not_applicable reasons, kernel
    time per config as a ratio to the fastest kernel, and the configs that fail on one kernel only."""
    from attnconfig.outcomes import OUTCOMES
    from store.db import session_scope
    from store.kernels import kernel_comparison

    if len(sweeps) < 2:
        fail("SWEEPS: name at least two sweeps to compare")
    url = existing_database(db)
    try:
        with session_scope(url) as s:
            report = kernel_comparison(s, sweeps)
    except LookupError as exc:
        fail(f"{exc} in {db_source(db)}")
    if as_json:
        print(json.dumps(report, default=str))
        return
    out = Console(soft_wrap=True)
    table = Table(title=f"{len(sweeps)} sweeps: {report['common']} configs in every one, {report['ran_by_all']} run "
                        "by every kernel")
    for column in ("sweep", "kernel", "version", "configs", "outcomes", "time / fastest", "fastest on"):
        table.add_column(column, overflow="fold")
    for r in report["sweeps"]:
        outcomes = ", ".join(f"{o} {r['outcomes'][o]}" for o in OUTCOMES if r["outcomes"].get(o))
        table.add_row(str(r["id"]), r["kernel_name"], r["kernel_version"] or "", str(r["configs"]), outcomes,
                      _ratio(r["time_ratio_median"]), str(r["fastest"]))
    out.print(table)
    for r in report["sweeps"]:
        if r["not_applicable"]:
            reasons = ", ".join(f"{k} {n}" for k, n in sorted(r["not_applicable"].items(), key=lambda kv: -kv[1]))
            out.print(f"sweep {r['id']} ({r['kernel_name']}) not_applicable: {reasons}", highlight=False, markup=False)
    shown = report["only_one"][:limit]
    out.print(f"configs failing on one kernel only: {report['only_one_total']}", highlight=False)
    for row in shown:
        out.print(f"  sweep {row['sweep_id']} ({row['kernel']}): {row['outcome']}"
                  + (f" ({row['failed_gate']})" if row["failed_gate"] else "") + f"  {json.dumps(row['config'])}",
                  highlight=False, markup=False)
