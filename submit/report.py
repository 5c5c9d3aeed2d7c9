"""What a local sweep left in the store, read back for `attnsweep run` to print: the sweep report
(docs/spec.md §8 keys, and `coverage`: docs/spec.md §6's coverage report), its outcomes by
dtype, its triage, its JUnit XML, and what an interruption left stored."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ci.junit import render
from ci.status import junit_bugs
from store import repo
from store.clusters import clusters_report
from store.coverage import sweep_coverage
from store.db import Session
from store.models import Sweep
from store.sweeps import backend_that_ran, get_sweep, runs_in_order


@dataclass(frozen=True)
class RunReport:
    report: dict[str, Any]                 # sweep_report: what --report-json writes
    by_dtype: dict[str, dict[str, int]]    # outcome counts per dtype
    triage: dict[str, Any] | None          # store.clusters.clusters_report; None: not triaged
    junit: bytes | None                    # ci.junit.render of the sweep; None: not asked for


def sweep_report(session: Session, sweep_id: int, wall_s: float) -> dict[str, Any]:
    sweep = get_sweep(session, sweep_id)
    counts = repo.sweep_counts(session, sweep_id)
    return {
        "sweep_id": sweep_id,
        "seed": sweep.seed,
        "label": sweep.label,
        "backend": backend_that_ran(session, sweep_id) or sweep.backend,   # auto: the backend that really ran
        "device": sweep.device,
        "kernel": sweep.kernel_name or sweep.kernel,
        "kernel_version": sweep.kernel_version,
        "configs_total": counts["configs_total"],
        "configs_run": counts["configs_done"],
        "workers": repo.results_by_worker(session, sweep_id),
        "outcomes": counts["outcomes"],
        "not_applicable_reasons": counts["not_applicable_reasons"],
        "filtered": counts["filtered"],
        "splitkv_budget": sweep.splitkv_budget,
        "wall_s": round(wall_s, 3),
        "configs_per_s": round(counts["configs_done"] / wall_s, 3) if wall_s > 0 else None,
        "coverage": sweep_coverage(session, sweep_id),
    }


def run_report(session: Session, sweep_id: int, wall_s: float, *, triaged: bool, junit: bool) -> RunReport:
    """Everything `attnsweep run` prints and writes about a finished sweep, read in one transaction."""
    junit_xml = None
    if junit:
        sweep = session.get(Sweep, sweep_id)
        bugs, summary = junit_bugs(session, sweep)
        junit_xml = render(sweep, list(runs_in_order(session, sweep_id)), bugs=bugs, summary=summary)
    done = RunReport(sweep_report(session, sweep_id, wall_s), repo.outcomes_by_dtype(session, sweep_id),
                     clusters_report(session, sweep_id) if triaged else None, junit_xml)
    session.commit()
    return done


def stored_state(session: Session, sweep_id: int) -> tuple[str, int, int]:
    """(status, configs done, configs in all) of a sweep as stored now: what an interrupted run left."""
    session.rollback()   # an interruption may have left the session inside a transaction it broke
    status = get_sweep(session, sweep_id).status
    counts = repo.sweep_counts(session, sweep_id)
    return status, counts["configs_done"], counts["configs_total"]
