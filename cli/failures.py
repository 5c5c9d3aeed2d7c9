"""`attnsweep failures`: the stored failures, with the bug each belongs to and the command that
reproduces each. Registered on the main app by cli/main.py, like cli/triage.py."""
from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.common import console, existing_database, fail, redacted

app = typer.Typer()


@app.command()
def failures(
    sweep: Optional[int] = typer.Argument(None, min=1, help="sweep id (default: every sweep, newest failures first)"),
    db: Optional[str] = typer.Option(None, "--db", help="SQLite path or database URL (default: ATTNSWEEP_DATABASE_URL, "
                                                        "else ./attnsweep.db)"),
    outcome: Optional[str] = typer.Option(None, "--outcome", help="only these failing outcomes, comma-separated: fail, "
                                                                  "nan, fault, unsafe, error, timeout, oom"),
    gate: Optional[str] = typer.Option(None, "--gate", help="only failures charged to these gates, comma-separated: rms, "
                                                            "row, lse, partials, err_ratio"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="only these dtypes, comma-separated: f16, bf16, f32, i8"),
    regime: Optional[str] = typer.Option(None, "--regime", help="only these data regimes, comma-separated: normal, sink, "
                                                                "outliers, large_logits, uniform, cancellation"),
    label: Optional[str] = typer.Option(None, "--label", help="only sweeps with this label"),
    bug: Optional[int] = typer.Option(None, "--bug", min=1, help="with SWEEP: only the failures of its bug N (the "
                                                                 "numbers `attnsweep triage SWEEP` and `run` print)"),
    limit: int = typer.Option(50, "--limit", min=1, max=1000, help="most failures to list"),
    as_json: bool = typer.Option(False, "--json", help="print {failures: [...], total, has_more} as one JSON object (the "
                                                       "API's failure rows, each with its bug number or null)"),
) -> None:
    """List stored failures: the bug each belongs to, the gate, the metric against its bound, and
    the command that reproduces each. Never creates or migrates a database."""
    from api.convert import config_run_public, gate_check
    from api.errors import ProblemError
    from api.filters import parse_str_match
    from api.schemas.analysis import FailureRow
    from attnconfig.outcomes import FAILING_OUTCOMES
    from store import queries
    from store.clusters import bug_numbers, stored_clusters, triage_status
    from store.db import session_scope
    from store.models import Sweep

    url = existing_database(db)
    if bug is not None and sweep is None:
        fail("--bug: name the SWEEP too (bugs are numbered per sweep)")
    matches = {}
    try:
        for option, column, text, allowed in (("--outcome", "outcome", outcome, FAILING_OUTCOMES),
                                              ("--gate", "failed_gate", gate, None), ("--dtype", "dtype", dtype, None),
                                              ("--regime", "data_regime", regime, None)):
            if text is not None:
                matches[column] = parse_str_match(option, column, text, allowed)
    except ProblemError as exc:
        fail(exc.problems[0][1])
    if sweep is not None:
        matches["sweep_id"] = queries.Match(values=(sweep,))
    with session_scope(url) as s:
        if sweep is not None and s.get(Sweep, sweep) is None:
            fail(f"sweep {sweep}: no such sweep in {redacted(url)}")
        if bug is not None:
            clusters = stored_clusters(s, sweep) if triage_status(s, sweep) == "done" else None
            if clusters is None:
                fail(f"--bug {bug}: sweep {sweep} is not triaged (`attnsweep triage {sweep}` triages it)")
            if bug > len(clusters):
                fail(f"--bug {bug}: sweep {sweep} has {len(clusters)} bug{'s' if len(clusters) != 1 else ''}")
            matches["config_hash"] = queries.Match(values=tuple(clusters[bug - 1].config_hashes))
        page = queries.failures(s, queries.ResultFilter(matches=matches, label=label), limit=limit, with_count=True)
        bugs = bug_numbers(s, [run.sweep_id for run, _label in page.rows])
        rows = []
        for run, run_label in page.rows:
            public = config_run_public(run, run_label)
            rows.append(FailureRow(**public.model_dump(), check=gate_check(public),
                                   bug=bugs.get((run.sweep_id, run.config_hash))))
    if as_json:
        print(json.dumps({"failures": [r.model_dump(mode="json") for r in rows], "total": page.count,
                          "has_more": page.has_more}, default=str))
        return
    if not rows:
        console.print("no failures" + (f" in sweep {sweep}" if sweep is not None else ""), highlight=False)
        return
    _print_failures(rows, page.count or len(rows))


def _g(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def _print_failures(rows: list, total: int) -> None:
    from ci.junit import case_name

    out = Console()
    shown = f"{len(rows)} of {total} failures shown; raise --limit" if total > len(rows) else f"{total} failures"
    table = Table(title=Text(shown))
    for column in ("#", "sweep", "bug", "outcome", "gate", "metric vs bound", "config"):
        table.add_column(column, overflow="fold")
    for i, r in enumerate(rows, 1):
        c = r.check
        check = f"{c.metric}={_g(c.value)} > {_g(c.bound)}" if c.metric else (c.why or "")
        # Text, not markup: a config's hash in brackets ([e04d7f9f9465]) would be read as a tag.
        table.add_row(*(Text(v) for v in (str(i), str(r.sweep_id), str(r.bug or "-"), r.outcome or "", c.gate or "",
                                          check, case_name(r))))
    out.print(table)
    # Reproducers are long; on their own lines they stay copyable whatever the terminal's width.
    out.print("reproducers:", highlight=False)
    for i, r in enumerate(rows, 1):
        out.print(f"#{i}: {r.reproducer or '(none stored)'}", highlight=False, soft_wrap=True, markup=False)
