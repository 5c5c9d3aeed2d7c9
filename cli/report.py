"""The sweep report (docs/spec.md §8 keys, and `coverage`: docs/spec.md §6's coverage report) and
the closing summary tables."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from attnconfig.outcomes import OUTCOMES
from store import repo
from store.coverage import sweep_coverage
from store.db import session_scope
from store.sweeps import backend_that_ran, get_sweep
from sweeps.coverage import coverage_summary


def sweep_report(url: str, sweep_id: int, wall_s: float) -> dict[str, Any]:
    with session_scope(url) as s:
        sweep = get_sweep(s, sweep_id)
        counts = repo.sweep_counts(s, sweep_id)
        return {
            "sweep_id": sweep_id,
            "seed": sweep.seed,
            "label": sweep.label,
            "backend": backend_that_ran(s, sweep_id) or sweep.backend,   # auto: the backend that really ran
            "device": sweep.device,
            "kernel": sweep.kernel_name or sweep.kernel,
            "kernel_version": sweep.kernel_version,
            "configs_total": counts["configs_total"],
            "configs_run": counts["configs_done"],
            "workers": repo.results_by_worker(s, sweep_id),
            "outcomes": counts["outcomes"],
            "not_applicable_reasons": counts["not_applicable_reasons"],
            "filtered": counts["filtered"],
            "splitkv_budget": sweep.splitkv_budget,
            "wall_s": round(wall_s, 3),
            "configs_per_s": round(counts["configs_done"] / wall_s, 3) if wall_s > 0 else None,
            "coverage": sweep_coverage(s, sweep_id),
        }


def print_summary(console: Console, url: str, sweep_id: int, report: dict[str, Any]) -> None:
    with session_scope(url) as s:
        by_dtype = repo.outcomes_by_dtype(s, sweep_id)
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
