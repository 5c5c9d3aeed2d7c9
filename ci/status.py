"""A commit's CI state read from the store: its sweep, the base sweep, the verdict and failures."""
from __future__ import annotations

from typing import Any

from attnconfig.outcomes import METRIC_KEYS
from ci.verdict import bisections_text, failures_text, judge, new_bugs
from store import bisections as bisection_store
from store import clusters as triage_store
from store import repo
from store.ci import base_sweep, failing_hashes, failing_runs
from store.db import Session
from store.models import ConfigRun, Sweep
from store.queries import failure_rate


def bug_members(session: Session, sweep_id: int) -> list[set[str]] | None:
    """The config hashes of each stored cluster of the sweep (one set per bug), or None while
    its triage is not done."""
    if triage_store.triage_status(session, sweep_id) != "done":
        return None
    return [set(c.config_hashes) for c in triage_store.stored_clusters(session, sweep_id)]


def junit_bugs(session: Session, sweep: Sweep) -> tuple[list[Any] | None, str | None]:
    """(stored clusters or None, the failures in words) for ci.junit.render."""
    summary = commit_status(session, sweep, with_failures=False)["summary"]
    if triage_store.triage_status(session, sweep.id) != "done":
        return None, summary
    return triage_store.stored_clusters(session, sweep.id), summary


def failure_public(run: ConfigRun) -> dict[str, Any]:
    return {
        "config_hash": run.config_hash, "outcome": run.outcome, "failed_gate": run.failed_gate,
        "detail": (run.detail or "").splitlines()[0][:500] if run.detail else None, "config": run.config,
        "metrics": {k: getattr(run, k) for k in METRIC_KEYS if getattr(run, k) is not None},
        "reproducer": run.reproducer,
    }


def commit_status(session: Session, sweep: Sweep, with_failures: bool = True) -> dict[str, Any]:
    """State, verdict and counts of a CI sweep; with the failures, new and known, when asked."""
    counts = repo.sweep_counts(session, sweep.id)
    runs = failing_runs(session, sweep.id) if with_failures else None
    failing = [r.config_hash for r in runs] if runs is not None else sorted(failing_hashes(session, sweep.id))
    base = base_sweep(session, sweep)
    base_failing = failing_hashes(session, base.id) if base is not None else None
    judgement = judge(sweep.status, sweep.event, failing, base_failing)
    applicable = counts["configs_done"] - counts["outcomes"]["not_applicable"]
    out: dict[str, Any] = {
        "commit_sha": sweep.commit_sha, "repository": sweep.repository, "ref": sweep.ref, "event": sweep.event,
        "base_ref": sweep.base_ref, "pr_number": sweep.pr_number, "sweep_id": sweep.id, "state": sweep.status,
        "verdict": judgement.verdict, "source_hash": sweep.source_hash, "configs": counts["configs_total"],
        "configs_done": counts["configs_done"], "failures": len(failing),
        "failure_rate": failure_rate(len(failing), applicable),
        "new_failure_count": len(judgement.new), "known_failure_count": len(judgement.known),
        "base_sweep_id": base.id if base is not None else None,
        "base_commit_sha": base.commit_sha if base is not None else None,
        "error": sweep.error, "created_at": sweep.created_at, "finished_at": sweep.finished_at,
    }
    bugs = bug_members(session, sweep.id)
    out["triage"] = triage_store.triage_status(session, sweep.id)
    out["bugs"] = len(bugs) if bugs is not None else None
    out["new_bugs"] = new_bugs(judgement, bugs) if bugs is not None else None
    out["summary"] = (failures_text(judgement, len(failing), bugs, base is not None and sweep.event == "pull_request")
                      if judgement.verdict in ("pass", "fail") else None)
    bisections = bisection_store.bisections_for_sweep(session, sweep.id)
    out["bisections"] = [bisection_brief(b) for b in bisections]
    out["first_bad_commits"] = list(dict.fromkeys(b.first_bad for b in bisections if b.status == "done" and b.first_bad))
    if bisections and out["summary"]:
        out["summary"] += "; " + bisections_text([(b.status, b.first_bad, b.candidates or ()) for b in bisections])
    if runs is not None:
        by_hash = {r.config_hash: r for r in runs}
        out["new_failures"] = [failure_public(by_hash[h]) for h in judgement.new]
        out["known_failures"] = [failure_public(by_hash[h]) for h in judgement.known]
    return out


def bisection_brief(row: Any) -> dict[str, Any]:
    """A CI sweep's bisection as GET /ci/{sha} shows it (the whole of it: GET /bisect/{id})."""
    return {"id": row.id, "cluster": row.cluster_rank, "status": row.status, "good": row.good, "bad": row.bad,
            "first_bad": row.first_bad,
            "candidates": row.candidates or [], "configs": len(row.configs or []), "error": row.error,
            "url": f"/bisect/{row.id}"}
