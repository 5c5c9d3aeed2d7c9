"""`attnsweep triage`, `shrink` and `bisect`: the failures of a sweep as bugs (triage/).

Registered on the main app by cli/main.py (app.add_typer without a name adds these commands
at the top level). It imports nothing of cli.main (the two would form an import cycle); what
the commands share is in cli/common.py.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.console import Console

from cli.common import console, existing_database, fail, option_text
from cli.options import defect_option

app = typer.Typer()

DB_HELP = "SQLite path or database URL (default: ATTNSWEEP_DATABASE_URL, else ./attnsweep.db)"
BACKEND_HELP = "cpu|cuda|hip|hostemu|auto"
MAX_RUNS = typer.Option(200, "--max-runs", min=1, help="most real runs one shrink may spend")
MAX_SECONDS = typer.Option(120.0, "--max-seconds", min=0.1, help="most seconds one shrink may spend")
TIME_LIMIT = typer.Option(30.0, "--time-limit", min=0, help="seconds one run may take before it counts as timeout (0: none)")
# A sweep's triage is bounded as a worker bounds it (settings' TRIAGE_*), unless an option says otherwise.
SWEEP_MAX_RUNS = typer.Option(None, "--max-runs", min=1,
                              help="most real runs one shrink may spend (default: ATTNSWEEP_TRIAGE_SHRINK_RUNS, 100)")
SWEEP_MAX_SECONDS = typer.Option(None, "--max-seconds", min=0.1,
                                 help="most seconds one shrink may spend (default: ATTNSWEEP_TRIAGE_SHRINK_SECONDS, 60)")
SWEEP_TIME_LIMIT = typer.Option(None, "--time-limit", min=0, help="seconds one run may take before it counts as "
                                "timeout, 0: none (default: ATTNSWEEP_TRIAGE_RUN_TIME_LIMIT_S, 30)")
MAX_CLUSTERS = typer.Option(None, "--max-clusters", min=0, help="shrink and classify the largest this many clusters, "
                            "explain the rest (default: ATTNSWEEP_TRIAGE_CLUSTERS, 8)")


def _config(text: str, option: str = "--config") -> dict[str, Any]:
    from attnconfig import ConfigError, parse_config

    text = option_text(text, option)
    try:
        return parse_config(text).to_dict()
    except ConfigError as exc:
        fail(f"{option}: {exc}")


def _limit(seconds: float) -> float | None:
    return seconds or None


def _signature_shown(cluster: dict[str, Any]) -> str:
    """What the reproducer gave when the triage ran it, where that is not the bug's signature."""
    gave = cluster.get("reproducer_signature")
    if not gave or gave == cluster["signature"]:
        return ""
    label = "/".join(str(v or "-") for v in (gave["outcome"], gave["gate"], gave["location"]))
    return f"(when the triage ran it, it gave {label}, not the bug's signature)"


@app.command()
def triage(
    sweep: int = typer.Argument(..., min=1, help="sweep id"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", help=BACKEND_HELP + " (default: the backend its results name)"),
    recompute: bool = typer.Option(False, "--recompute", help="compute and store the clusters again even when stored"),
    no_shrink: bool = typer.Option(False, "--no-shrink", help="cluster and explain only: run nothing, store nothing"),
    max_runs: Optional[int] = SWEEP_MAX_RUNS,
    max_seconds: Optional[float] = SWEEP_MAX_SECONDS,
    time_limit: Optional[float] = SWEEP_TIME_LIMIT,
    max_clusters: Optional[int] = MAX_CLUSTERS,
    as_json: bool = typer.Option(False, "--json", help="print {status, clusters: [...]} as one JSON object"),
) -> None:
    """Cluster a sweep's failures by bug; explain, shrink and classify each cluster.

    A cluster is one bug as far as the results tell: its failures share a signature (outcome,
    deciding gate, location: the kernel family, or the split-KV combine every family shares)
    and the config conditions that explain them. Its smallest
    member is shrunk to a minimal reproducer, which is classified (deterministic,
    data-dependent, flaky). The clusters a worker or an earlier call stored are shown as
    stored; otherwise (or with --recompute) they are computed here and stored.

    Exit status: 0 when shown, 1 when the triage failed or a worker is running it, 2 on a
    usage mistake."""
    from store import clusters as stored
    from store.db import unit_of_work
    from store.models import Sweep
    from triage.sweep import SweepNotFound, clusters_json, triage_sweep
    from settings import get_settings
    from workers.triage import run_triage, triage_bounds

    url = existing_database(db)
    with unit_of_work(url) as s:   # the command's one session: each step commits its own transaction
        if s.get(Sweep, sweep) is None:
            fail(f"sweep {sweep}: no such sweep")
        status = stored.triage_status(s, sweep)
        s.commit()
        if no_shrink:
            try:
                report = {"status": "unstored", **clusters_json(triage_sweep(s, sweep, backend, shrink_configs=False,
                                                                             classify_configs=False))}
            except SweepNotFound as exc:
                fail(str(exc))
        else:
            if recompute or status != "done":
                bounds = {**triage_bounds(get_settings()), **{k: v for k, v in (
                    ("max_runs", max_runs), ("max_seconds", max_seconds), ("max_clusters", max_clusters))
                    if v is not None}}
                if time_limit is not None:
                    bounds["time_limit_s"] = _limit(time_limit)
                if not as_json:
                    console.print(f"sweep {sweep}: triage (the largest {bounds['max_clusters']} clusters shrunk, at most "
                                  f"{bounds['max_runs']} runs and {bounds['max_seconds']:g} s each)", highlight=False)
                status = run_triage(s, sweep, backend=backend, force=recompute, bounds=bounds)
            report = stored.clusters_report(s, sweep)
    if as_json:
        print(json.dumps(report, default=str))
    elif report["status"] in ("done", "unstored"):
        _print_clusters(sweep, report["clusters"])
    if report["status"] == "failed":
        console.print(f"sweep {sweep}: triage failed: {report['error']}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    if report["status"] == "running":
        console.print(f"sweep {sweep}: a worker is triaging it; try again later, or --recompute", highlight=False)
        raise typer.Exit(1)


def bug_lines(clusters: list[dict[str, Any]]) -> list[str]:
    """"2 bugs in 119 failing configs", then one line per bug: size, signature, explanation,
    classification and the minimal reproducer."""
    failing = sum(c["size"] for c in clusters)
    if not clusters:
        return ["no failures: no bugs"]
    lines = [f"{len(clusters)} bug{'s' if len(clusters) != 1 else ''} in {failing} failing config{'s' if failing != 1 else ''}"]
    for i, c in enumerate(clusters, 1):
        sig = c["signature"]
        kind = (c["classification"] or {}).get("kind", "not classified")
        lines.append(f"  {i}. {c['size']} {sig['outcome']}/{sig['gate'] or '-'}/{sig['location']}: "
                     f"{c['explanation']['text']} ({kind}); reproducer: {c['reproducer'] or '-'}"
                     + (f" {_signature_shown(c)}" if _signature_shown(c) else ""))
    return lines


def _first_bad(cluster: dict[str, Any]) -> str:
    if cluster.get("first_bad_commit"):
        return cluster["first_bad_commit"]
    status = (cluster.get("bisection") or {}).get("status")
    states = {"queued": "bisecting", "running": "bisecting", "done": "ambiguous", "error": "bisection failed"}
    return states.get(status, "-")


def _print_clusters(sweep: int, clusters: list[dict[str, Any]]) -> None:
    from rich.table import Table
    from rich.text import Text

    out = Console()
    if not clusters:
        out.print(f"sweep {sweep}: no failures", highlight=False)
        return
    table = Table(title=Text(f"sweep {sweep}: {len(clusters)} bug{'s' if len(clusters) != 1 else ''} "
                             f"in {sum(c['size'] for c in clusters)} failing configs"))
    bisected = any(c.get("first_bad_commit") or c.get("bisection") for c in clusters)
    columns = ("bug", "size", "signature", "explanation", "class")
    for column in columns + (("first bad commit",) if bisected else ()):
        table.add_column(column, overflow="fold")
    for i, c in enumerate(clusters, 1):
        sig = c["signature"]
        label = f"{sig['outcome']}/{sig['gate'] or '-'}/{sig['location']}"
        if len(c["signatures"]) > 1:
            label += " (+" + ", ".join(f"{k} {n}" for k, n in c["signatures"].items() if k != label) + ")"
        kind = (c["classification"] or {}).get("kind", "-")
        row = [str(i), str(c["size"]), label, c["explanation"]["summary"], kind]
        table.add_row(*(Text(v) for v in row + ([_first_bad(c)] if bisected else [])))
    out.print(table)
    # Commands on their own lines stay copyable whatever the terminal's width.
    for i, c in enumerate(clusters, 1):
        what = "minimal reproducer" if c["minimal_config"] is not None else "reproducer (not shrunk)"
        out.print(f"bug {i} {what}: {c['reproducer'] or '-'}", highlight=False, soft_wrap=True, markup=False)
        shown = _signature_shown(c)
        if shown:
            out.print(f"  {shown}", highlight=False, soft_wrap=True, markup=False)


@app.command()
def shrink(
    config: str = typer.Option(..., "--config", help="a failing config as JSON, or @file"),
    backend: str = typer.Option("cpu", "--backend", help=BACKEND_HELP),
    defect: list[str] = defect_option(),
    max_runs: int = MAX_RUNS,
    max_seconds: float = MAX_SECONDS,
    time_limit: float = TIME_LIMIT,
    as_json: bool = typer.Option(False, "--json", help="print {config, minimal_config, runs, ...} as one JSON object"),
) -> None:
    """Shrink a failing config to a minimal one that fails the same way (outcome, gate, location).

    Exit status: 0 when shrunk, 1 when the config does not fail, 2 on a usage mistake, 3 when
    the backend's device is unavailable."""
    from kernels.backends.base import BackendUnavailable
    from triage.attempt import Runner
    from triage.shrink import shrink as shrink_config

    start = _config(config)
    runner = Runner(backend, frozenset(defect), time_limit_s=_limit(time_limit))
    try:
        result = shrink_config(start, runner, max_runs=max_runs, max_seconds=max_seconds)
    except BackendUnavailable as exc:
        fail(f"--backend {backend}: device unavailable: {exc}", 3)
    except ValueError as exc:  # the config does not fail: nothing to shrink
        console.print(str(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    finally:
        runner.close()
    if as_json:
        print(json.dumps({**result.to_dict(), "reproducer": _reproducer(result.minimal_config, runner)}))
        return
    console.print(f"{result.signature.label()}: shrunk in {result.runs} runs ({result.seconds:.1f} s)"
                  + (", stopped by the budget" if result.budget_spent else "") + "; the minimal reproducer:",
                  highlight=False)
    print(_reproducer(result.minimal_config, runner))


def _reproducer(config: dict[str, Any], runner: Any) -> str:
    from attnconfig import parse_config
    from sweeps.result import reproducer_command

    minimal = parse_config(config)
    return reproducer_command(minimal, runner.backend_name, runner.gates(minimal), runner.defects, runner.kernel)


@app.command()
def bisect(
    repo: str = typer.Option(..., "--repo", help="the kernel repository: a local path or a URL"),
    good: str = typer.Option(..., "--good", help="a commit where the configs pass"),
    bad: str = typer.Option(..., "--bad", help="a commit where they fail"),
    config: list[str] = typer.Option(..., "--config", help="a config as JSON, or @file (repeatable)"),
    backend: str = typer.Option("cpu", "--backend", help=BACKEND_HELP + " (cpu sees a commit's defect switches only; "
                                "hostemu and the GPU backends compile it, so a commit that does not compile is skipped)"),
    time_limit: float = TIME_LIMIT,
    as_json: bool = typer.Option(False, "--json", help="print {first_bad, steps, skipped, ...} as one JSON object"),
) -> None:
    """Find the first commit between --good and --bad at which the configs fail.

    The bisection walks --repo's first-parent history. Exit status: 0 when found, 1 when
    skipped commits leave it ambiguous, 2 on a usage mistake or when the ends do not bound a
    change, 3 when the backend's device is unavailable."""
    from kernels.backends.base import BackendUnavailable
    from kernelsrc.git import KernelRepoError
    from triage.bisect import BisectError
    from triage.bisect import bisect as run_bisect

    configs = [_config(c) for c in config]
    try:
        result = run_bisect(repo, good, bad, configs, backend, time_limit_s=_limit(time_limit))
    except (BisectError, KernelRepoError) as exc:
        fail(str(exc))
    except BackendUnavailable as exc:
        fail(f"--backend {backend}: device unavailable: {exc}", 3)
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        from kernelsrc.git import commit_subject
        from settings import get_settings

        for sha, verdict in result.tested:
            console.print(f"{sha[:12]} {verdict}", highlight=False)
        cache = get_settings().kernel_repo_cache
        if result.first_bad:
            # As `git bisect` ends: the commit, then its subject.
            print(f"{result.first_bad} is the first bad commit")
            print(f"    {commit_subject(repo, result.first_bad, cache)}")
        else:
            print(f"ambiguous: the first bad commit is one of these {len(result.candidates)} (skipped commits, which "
                  "do not compile, leave it open):")
            for sha in result.candidates:
                print(f"{sha} {commit_subject(repo, sha, cache)}")
    raise typer.Exit(0 if result.first_bad else 1)
