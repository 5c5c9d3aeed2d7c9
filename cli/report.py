"""The closing summary tables of `attnsweep run`, from the report submit.report reads."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from attnconfig.outcomes import OUTCOMES
from sweeps.coverage import coverage_summary


def print_summary(console: Console, sweep_id: int, report: dict[str, Any], by_dtype: dict[str, dict[str, int]]) -> None:
    table = Table(title=f"sweep {sweep_id}: outcomes by dtype ({report['backend']}, {report['device']})")
    table.add_column("dtype")
    for o in OUTCOMES:
        table.add_column(o, justify="right")
    for dtype in sorted(by_dtype):
        table.add_row(dtype, *(str(by_dtype[dtype][o]) for o in OUTCOMES))
    table.add_row("all", *(str(report["outcomes"][o]) for o in OUTCOMES), style="bold")
    console.print(table)

    filt = Table(title="prefilter rejections (every draw)")
    filt.add_column("reason")
    filt.add_column("count", justify="right")
    for reason, n in sorted(report["filtered"].items(), key=lambda kv: -kv[1]):
        filt.add_row(reason, str(n))
    console.print(filt)
    if report["not_applicable_reasons"]:
        console.print(f"not applicable: {report['not_applicable_reasons']}", highlight=False)
    if len(report["workers"]) > 1:
        console.print("stored per worker: " + ", ".join(f"{w} {n}" for w, n in report["workers"].items()), highlight=False)
    console.print(coverage_summary(report["coverage"]), highlight=False, soft_wrap=True)
    console.print(f"{report['configs_run']} configs in {report['wall_s']:.1f} s: {report['configs_per_s']:.2f} configs/s", highlight=False)
