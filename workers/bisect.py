"""Bisections (triage/bisect.py) run by a worker, never by the API process.

- POST /bisect stores a `queued` row (submit/bisect.py) and publishes one task
  (`attnsweep.bisect`) to the queue of its backend: `cpu` and `hostemu` to the cpu queue, the
  GPU backends to the GPU queue.
- A CI push whose sweep has new failures (failing configs that did not fail on the finished push
  sweep of its `before` commit; all of them when that commit has none) and that brought at least
  MIN_COMMITS commits on its first-parent line is bisected from `before` to the pushed commit,
  once per bug: one bisection for each triage cluster holding a new failure, the largest
  ATTNSWEEP_CI_BISECT_CLUSTERS of them, each over one config of its own (`representative`) and
  stored with the cluster's rank and signature. When the triage failed or found no clusters,
  one bisection runs over the first new failure in sampled order. The worker that triages the
  sweep plans them (`plan_ci_bisections`) and stores them in the transaction that stores the
  triage (workers/triage.py), so a triage that is done has made the decision once. The
  repository is the deployment's ATTNSWEEP_KERNEL_REPO, the one the webhook read the pushed
  commit from; a worker that cannot read it stores the bisections `error` with the reason, and
  the sweep is untouched.

`run_bisection` claims the row (store/bisections.py), runs the bisection with a heartbeat after
each commit tested (the commits tested so far are stored with it), and stores the result once,
under its claim; a cluster's bisection writes its first bad commit onto the stored cluster in
that same transaction (store/bisections.py). A task delivered again finds the bisection running
or done and does nothing; a bisection whose worker died (no heartbeat for `stale_after_s`) is
put back to queued and published again by the reconciler (workers.outbox), and one whose
worker died MAX_ATTEMPTS times is stored `error`. A task the broker did not take is published by the reconciler too.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from settings import Settings, get_settings
from store import bisections as stored
from store.db import Session, is_unreachable, session_scope
from store.clusters import signature_label
from store.models import Bisection, ConfigRun, Sweep
from store.repo import now
from workers.publish import publish_background

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

MIN_COMMITS = 2       # a push of one commit needs no bisection: that commit is the first bad one
MAX_ATTEMPTS = 3      # claims of one bisection whose worker died each time before it is stored `error`
DEFAULT_RUN_S = 60.0  # one run's share of the stale limit when runs have no time limit


def stale_after_s(settings: Settings, configs: int) -> float:
    """Seconds without a heartbeat after which a running bisection's worker is taken for dead: a
    heartbeat follows each commit tested, which reads the commit and runs (and compiles) each
    config once, each run within ATTNSWEEP_TRIAGE_RUN_TIME_LIMIT_S."""
    run_s = settings.triage_run_time_limit_s or DEFAULT_RUN_S
    return max(1, configs) * (run_s + 120.0) + 120.0


class _ClaimLost(Exception):
    """Another worker took the bisection again (this one was thought dead): stop, store nothing."""


def _notify_ci(url: str, sweep_id: int | None) -> None:
    if sweep_id is None:
        return
    # The CI sweep's commit status again, now naming the first bad commit (ci.verdict.bisection_text).
    from ci.notify import sweep_ended as post_final_status

    post_final_status(sweep_id, url)


def run_bisection(url: str, bisection_id: int, settings: Settings | None = None) -> str:
    """Run the bisection unless another worker runs (or ran) it; returns its status afterwards
    (done, error; queued or running when another holds it; none when there is no such row)."""
    from kernels.errors import BackendUnavailable
    from kernelsrc.git import KernelRepoError
    from kernelsrc.trust import is_trusted
    from triage.bisect import BisectError, BisectResult, bisect

    settings = settings or get_settings()
    with session_scope(url) as s:
        row = s.get(Bisection, bisection_id)
        if row is None:
            return "none"
        token = stored.claim(s, bisection_id, stale_after_s=stale_after_s(settings, len(row.configs or [])))
        if token is None:
            return row.status
        request = {"repo": row.repo, "good": row.good, "bad": row.bad, "configs": list(row.configs),
                   "backend": row.backend, "defects": frozenset(row.defects or ()), "err_ratio_gate": row.err_ratio_gate}
        sweep_id = row.sweep_id
    if not is_trusted(request["repo"], settings):
        # Checked by the API before storing; checked again before any connection, for a row stored
        # under settings that trusted more.
        _store_error(url, bisection_id, token, "repo is not a repository this deployment trusts (ATTNSWEEP_KERNEL_REPO, "
                                               "ATTNSWEEP_KERNEL_REPOSITORIES): not fetched", settings=settings)
        return "error"
    if token > MAX_ATTEMPTS:
        _store_error(url, bisection_id, token, f"{token - 1} workers ended while running this bisection without "
                                               "storing a result (killed, or a crash in a run); not run again",
                     settings=settings)
        _notify_ci(url, sweep_id)
        return "error"
    partial: list[BisectResult] = []

    def progress(result: BisectResult) -> None:
        partial[:] = [result]
        with session_scope(url) as s:
            if not stored.heartbeat(s, bisection_id, token, [list(t) for t in result.tested]):
                raise _ClaimLost()

    try:
        result = bisect(request["repo"], request["good"], request["bad"], request["configs"], request["backend"],
                        defects=request["defects"], err_ratio_gate=request["err_ratio_gate"],
                        cache_dir=settings.kernel_repo_cache, time_limit_s=settings.triage_run_time_limit_s or None,
                        progress=progress, settings=settings)
    except _ClaimLost:
        log.warning("bisection %s: another worker took it again; this run's result is dropped", bisection_id)
        return "running"
    except KernelRepoError as exc:
        reason = str(exc) if exc.missing else f"the kernel repository cannot be read from this worker: {exc}"
        _store_error(url, bisection_id, token, reason, partial, settings)
    except (BisectError, BackendUnavailable, ValueError) as exc:
        _store_error(url, bisection_id, token, str(exc), partial, settings)
    except Exception as exc:  # noqa: BLE001 - any other failure is the bisection's error, never the worker's
        if is_unreachable(exc):
            raise  # the task retries; the claim goes stale and the reconciler queues it again
        log.exception("bisection %s failed", bisection_id)
        _store_error(url, bisection_id, token, f"{type(exc).__name__}: {exc}", partial, settings)
    except BaseException:
        # Stopped (a shutdown, a time limit): the claim is left to go stale and be taken again.
        raise
    else:
        with session_scope(url) as s:
            if not stored.finish(s, bisection_id, token, result.to_dict()):
                log.warning("bisection %s: another worker took it again; this run's result is dropped", bisection_id)
                return "running"
        _notify_ci(url, sweep_id)
        return "done"
    _notify_ci(url, sweep_id)
    return "error"


def _store_error(url: str, bisection_id: int, token: int | None, reason: str, partial: Sequence[Any] = (),
                 settings: Settings | None = None) -> None:
    """Store the bisection `error` with `reason`, scrubbed (git's errors quote the URL it fetched,
    credentials and all)."""
    with session_scope(url) as s:
        last = partial[0].to_dict() if partial else None
        stored.fail(s, bisection_id, token, (settings or get_settings()).scrub(reason), result=last)


def record_failure(url: str, bisection_id: int, reason: str) -> None:
    """Store the bisection `error` whoever holds it (the task itself failed: its hard time limit);
    a database that is away too is logged, not raised."""
    try:
        with session_scope(url) as s:
            stored.fail(s, bisection_id, None, get_settings().scrub(reason))
    except Exception:  # noqa: BLE001 - the row goes stale and is taken again
        log.exception("bisection %s: its failure was not stored", bisection_id)


# --- publishing -----------------------------------------------------------------------------------
def publish_pending(session: Session, celery: Celery, settings: Settings) -> int:
    """Put back the bisections whose worker died, then publish every queued one not published."""
    requeued = stored.requeue_stale(session, lambda row: stale_after_s(settings, len(row.configs or [])))
    if requeued:
        log.warning("bisections %s: no heartbeat from their workers; queued again", requeued)
    session.commit()
    done = sum(publish_background(session, celery, settings, "bisection", b) for b in stored.unpublished(session))
    session.commit()
    return done


# --- a CI push's bisections -----------------------------------------------------------------------
# Classifications under which the minimal config failed with its cluster's signature whenever it
# ran on its own inputs: a bisection over it sees the bug at every commit that has it.
REPEATS = ("deterministic", "data_dependent")


def _cost(config: Mapping[str, Any]) -> tuple[int, str]:
    # The problem's size, as triage.cluster.Cluster.example orders members.
    from attnconfig import parse_config

    c = parse_config(config)
    return (c.g * c.num_heads_q * c.seq_len_q * c.seq_len_k * (c.head_dim_qk + c.head_dim_v) * c.split_kv,
            c.content_hash())


def representative(cluster: Mapping[str, Any], new: Mapping[str, ConfigRun]) -> dict[str, Any] | None:
    """The config a cluster (Cluster.to_dict) is bisected over, None when it holds no new failure
    (`new`: the sweep's new failures by config hash). Every choice failed at the pushed commit:
    - its minimal config, when the shrink started from a new failure and the minimal config
      failed with the cluster's signature each time the classification repeated it (not
      classified: the shrink's own run of it): the cheapest config the bug shows in;
    - else the member the shrink started from, when it is a new failure;
    - else the cluster's cheapest new failure (the shrink started from a known one, whose
      smaller configs may fail at `before` as well)."""
    from attnconfig import parse_config

    members = [h for h in cluster.get("config_hashes") or () if h in new]
    if not members:
        return None
    start = parse_config(cluster["example_config"]).content_hash()
    if start in new:
        kind = (cluster.get("classification") or {}).get("kind")
        if cluster.get("minimal_config") is not None and (cluster.get("classification") is None or kind in REPEATS):
            return dict(cluster["minimal_config"])
        return dict(new[start].config)
    return dict(min((new[h].config for h in members), key=_cost))


def plan_ci_bisections(session: Session, sweep_id: int, settings: Settings,
                       clusters: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The bisections a finished CI push sweep is owed (Bisection columns), `error` ones when the
    repository cannot be read here; empty when it is owed none (see the module docstring).
    `clusters`: the triage's (Cluster.to_dict(), largest first), None when the triage failed.
    Reads in the caller's transaction, the one that stores the triage."""
    from store.ci import before_sweep, failing_hashes, failing_runs
    from kernelsrc.git import KernelRepoError, first_parent_commits

    if settings.ci_bisect_clusters == 0:
        return []
    sweep = session.get(Sweep, sweep_id)
    if sweep is None or sweep.event != "push" or sweep.status != "done" or not sweep.commit_sha:
        return []
    if stored.bisections_for_sweep(session, sweep_id):
        return []
    before = ((sweep.request or {}).get("ci") or {}).get("before")
    if not before or before == sweep.commit_sha:
        return []
    base = before_sweep(session, sweep)
    known = failing_hashes(session, base.id) if base is not None else set()
    new = {r.config_hash: r for r in failing_runs(session, sweep_id) if r.config_hash not in known}
    if not new:
        return []
    targets: list[tuple[int | None, str | None, dict[str, Any]]] = []
    for rank, cluster in enumerate(clusters or ()):
        config = representative(cluster, new)
        if config is not None and len(targets) < settings.ci_bisect_clusters:
            targets.append((rank, signature_label(cluster["signature"]), config))
    if not clusters:
        targets = [(None, None, dict(next(iter(new.values())).config))]
    request = sweep.request or {}
    common: dict[str, Any] = {
        "repo": settings.kernel_repo, "good": before, "bad": sweep.commit_sha,
        "backend": stored.most_run_backend(session, sweep_id) or sweep.backend,
        "defects": list(request.get("defects") or []), "err_ratio_gate": request.get("err_ratio_gate"),
        "repository": sweep.repository, "commit_sha": sweep.commit_sha, "sweep_id": sweep_id,
        "submitted_by": "webhook",
    }
    if not targets:
        return []
    try:
        commits = first_parent_commits(settings.kernel_repo, before, common["bad"], settings.kernel_repo_cache)
    except KernelRepoError as exc:
        where = "" if exc.missing else "the kernel repository cannot be read from this worker: "
        common = {**common, "status": "error", "error": settings.scrub(f"{where}{exc}")}
    else:
        if len(commits) - 1 < MIN_COMMITS:
            return []
    return [{**common, "configs": [config], "cluster_rank": rank, "cluster_signature": signature}
            for rank, signature, config in targets]


def store_plans(session: Session, plans: Sequence[Mapping[str, Any]]) -> list[int]:
    """Store planned CI bisections (queued, or error) unless their sweep has some; their ids. The
    caller commits, in the transaction that stores the triage."""
    if not plans or stored.bisections_for_sweep(session, plans[0]["sweep_id"]):
        return []
    ids = []
    for plan in plans:
        row = stored.create_bisection(session, **{k: v for k, v in plan.items() if k not in ("status", "error")})
        if plan.get("status") == "error":
            row.status, row.error, row.finished_at = "error", plan["error"], now()
            session.flush()
        ids.append(row.id)
    return ids


def ci_bisection_plans(session: Session, sweep_id: int, settings: Settings,
                       clusters: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """plan_ci_bisections that never raises: plans that cannot be made are logged, and the
    triage is stored without them. The caller calls it first in its transaction: a failed read
    is rolled back, which leaves the session usable and drops nothing of the caller's."""
    try:
        return plan_ci_bisections(session, sweep_id, settings, clusters)
    except Exception:  # noqa: BLE001 - the triage must not fail for its bisections
        session.rollback()
        log.exception("sweep %s: its CI bisections could not be planned", sweep_id)
        return []


def queued_for_sweep(session: Session, sweep_id: int) -> list[int]:
    """The ids of the sweep's bisections that are queued and not yet published."""
    return [row.id for row in stored.bisections_for_sweep(session, sweep_id)
            if row.status == "queued" and row.enqueued_at is None]
