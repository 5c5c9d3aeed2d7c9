"""Submit a sweep: check the limits, resolve the budget of its target, plan, commit, then enqueue
it for the service's workers (`submit_sweep`) or execute it in this machine's pool (`run_sweep`).

Planning is sweeps.plan.plan_sweep and storing store.repo.store_plan in both modes; the service
stores the configs with one COPY on PostgreSQL (a 10,000-config sweep is stored and queued in
about a second). The sweep, all its configs and their outbox marks are committed together
(nothing half-written); only then are the configs published (workers.outbox.submit), so a
worker never receives a config the database does not hold. If the broker refuses or does not
answer, the sweep is still accepted (`published` false) and the reconciler publishes it once
the broker is back.

Idempotency key: a client that retries a submission (a timeout, a dropped connection) sends the
same key and gets the sweep its first request made instead of a second one. The key is stored
with the sweep (unique) beside the sha256 of the request; the same key with another request is
refused.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

from attnconfig import AttentionConfig
from settings import Settings
from store import repo
from store.coverage import prior_counts
from store.db import IntegrityError, Session
from store.models import Sweep
from store.sweeps import get_sweep, sweep_by_idempotency_key, unpublished_configs
from sweeps.coverage import CellCounts
from sweeps.plan import SweepPlan, plan_sweep
from sweeps.result import ConfigResult
from sweeps.sampler import SamplingExhausted
from sweeps.spec import SweepSpec

if TYPE_CHECKING:
    from celery import Celery

IDEMPOTENCY_FIELD = "idempotency_key"


class SubmitError(ValueError):
    """A submission refused before anything is stored: (field, reason) pairs, the field named as
    the request names it (samples, configs, max_draws, idempotency_key)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(reason for _field, reason in problems))
        self.problems = problems


@dataclass(frozen=True)
class Submission:
    """A committed sweep: published to its queue (`published`), or left to the reconciler."""

    sweep: Sweep
    tasks: int
    published: bool
    replayed: bool
    draws: int
    filtered: dict[str, int] = field(default_factory=dict)


def bounded_draws(spec: SweepSpec, settings: Settings) -> SweepSpec:
    """The spec with its draws capped at settings.max_draws: a larger max_draws is refused, the
    default (1000 * samples) is cut to the cap, so no submission holds an API thread for long."""
    cap = settings.max_draws
    if spec.max_draws is not None and spec.max_draws > cap:
        raise SubmitError([("max_draws", f"max_draws={spec.max_draws}: must be <= {cap} (ATTNSWEEP_MAX_DRAWS)")])
    if spec.samples > cap:
        raise SubmitError([("samples", f"samples={spec.samples}: must be <= {cap} (ATTNSWEEP_MAX_DRAWS)")])
    if spec.max_draws is None and spec.resolved_max_draws() > cap:
        return spec.model_copy(update={"max_draws": cap})
    return spec


def checked_spec(spec: SweepSpec, configs: Sequence[AttentionConfig] | None, settings: Settings) -> SweepSpec:
    """The spec within the service's limits: configs per sweep, draws per request."""
    explicit = configs is not None
    wanted = len(configs) if explicit else spec.samples
    if wanted > settings.max_sweep_configs:
        name = "configs" if explicit else "samples"
        raise SubmitError([(name, f"{name}: {wanted} configs exceed the limit of {settings.max_sweep_configs} "
                                  "(ATTNSWEEP_MAX_SWEEP_CONFIGS)")])
    return spec if explicit else bounded_draws(spec, settings)


def planned(spec: SweepSpec, **kwargs: Any) -> SweepPlan:
    """sweeps.plan.plan_sweep, a sampling that found too few configs refused as a SubmitError."""
    try:
        return plan_sweep(spec, **kwargs)
    except SamplingExhausted as exc:
        raise SubmitError([("max_draws", str(exc))]) from None


def request_digest(spec: SweepSpec, configs: Sequence[AttentionConfig] | None, extra: dict[str, Any]) -> str:
    """sha256 of a submission's request: what an idempotency key's replay must repeat."""
    canon = json.dumps({"spec": spec.model_dump(mode="json"), "extra": extra,
                        "configs": [c.to_dict() for c in configs] if configs is not None else None},
                       sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


def _earlier(session: Session, key: str, digest: str) -> Sweep | None:
    sweep = sweep_by_idempotency_key(session, key)
    if sweep is not None and sweep.request_sha256 != digest:
        raise SubmitError([(IDEMPOTENCY_FIELD, f"{key!r} was used by sweep {sweep.id} with another request; "
                                               "use a new key for a new request")])
    return sweep


def _replayed(session: Session, sweep: Sweep) -> Submission:
    waiting = unpublished_configs(session, sweep.id)
    return Submission(sweep, 0, waiting == 0, True, sweep.draws, repo.sweep_counts(session, sweep.id)["filtered"])


def coverage_prior(session: Session, spec: SweepSpec, configs: Sequence[AttentionConfig] | None) -> CellCounts | None:
    """The prior of a coverage-guided draw: the cell counts of the newest
    `coverage_prior_sweeps` finished sweeps of the store (None: nothing is sampled, or no prior)."""
    if configs is not None or not spec.coverage_guided or not spec.coverage_prior_sweeps:
        return None
    return prior_counts(session, spec.coverage_prior_sweeps, mma=spec.backend == "cuda")


def submit_sweep(session: Session, celery: Celery, settings: Settings, spec: SweepSpec, *,
                 configs: list[AttentionConfig] | None = None, defects: Sequence[str] = (),
                 sanitize: tuple[str, float] | None = None, rerun_of: int | None = None,
                 extra_request: dict[str, Any] | None = None, idempotency_key: str | None = None,
                 also_store: Callable[[Session, Sweep], None] | None = None,
                 submitted_by: str | None = None) -> Submission:
    """Submit a sweep to the service's workers: the queue of its backend, the budget of that
    queue's live workers, planned, committed, then published. `also_store(session, sweep)`
    writes what a caller commits with the sweep (a CI sweep: its bundle, event and delivery).
    `submitted_by` names who asked (an API token's name). Raises SubmitError; an IntegrityError
    of a caller's unique key (a racing delivery) after rolling back."""
    extra = {"defects": list(defects), **(extra_request or {}), **({"configs": len(configs)} if configs is not None else {})}
    key = idempotency_key
    digest = request_digest(spec, configs, {**extra, "sanitize": list(sanitize) if sanitize else None,
                                            "rerun_of": rerun_of}) if key else None
    if key:
        earlier = _earlier(session, key, digest)
        if earlier is not None:
            return _replayed(session, earlier)
    spec = checked_spec(spec, configs, settings)
    # The broker's libraries load here, not with the module: the embedded run (run_sweep) needs
    # none of them, and a GPU host may not have them.
    from workers.app import queue_kind
    from workers.outbox import submit as commit_and_publish

    queue = settings.queue_name(queue_kind(spec.backend))
    memory, device = repo.queue_device_memory(session, queue, settings.worker_stale_s)
    plan = planned(spec, device_total_memory=memory, device=device, configs=configs, request_extra=extra,
                   sanitize=sanitize, defects=tuple(sorted(defects)), prior=coverage_prior(session, spec, configs))

    kept: list[Sweep] = []   # the session holds it weakly: a reference spares reading it back

    def store(s: Session) -> Sweep:
        sweep = repo.store_plan(s, plan, queue=queue, rerun_of=rerun_of, idempotency_key=key, request_sha256=digest,
                                submitted_by=submitted_by, kernel=spec.kernel)
        kept.append(sweep)
        if also_store is not None:
            also_store(s, sweep)
        return sweep

    try:
        done = commit_and_publish(session, celery, settings, store, dict(zip(plan.hashes, plan.configs)))
    except IntegrityError:
        # Two requests with one key raced: the first one's commit won; answer with its sweep.
        session.rollback()
        earlier = _earlier(session, key, digest) if key else None
        if earlier is None:
            raise
        return _replayed(session, earlier)
    return Submission(get_sweep(session, done.sweep_id), done.tasks, done.published, False, plan.draws, plan.filtered)


def run_sweep(session: Session, spec: SweepSpec, *, backend: str, device_total_memory: int | None,
              device: str | None, defects: frozenset[str] = frozenset(), sanitize: tuple[str, float] | None = None,
              jobs: int = 1, gpus: Sequence[int] = (), time_limit_s: float | None = None,
              started: Callable[[int, int], ContextManager[Callable[[ConfigResult], None] | None]] | None = None,
              triage: bool = False, triaging: Callable[[int], ContextManager[Any]] | None = None,
              kernel_identity: tuple[str, str] | None = None) -> int:
    """Run a sweep in this machine's embedded pool (workers.embedded): the budget of this
    machine's device, planned, committed, then executed, every result stored through `session`
    (the run's unit of work, store.db.unit_of_work: each step commits its own transaction).
    `started(sweep_id, configs_total)`: entered once the sweep is committed, around its
    execution; what it yields gets every result. With `triage`, the finished sweep's failures
    are then triaged in this process and the clusters stored (workers.triage.run_triage, inside
    `triaging(sweep_id)` when given); a triage that fails is stored as failed, and the sweep
    stays done. `kernel_identity`: the (name, version) the kernel under test says it is, where
    the caller loaded it. Returns the sweep id. Raises SubmitError."""
    from workers.embedded import execute_sweep
    from workers.triage import run_triage

    prior = coverage_prior(session, spec, None)
    session.commit()
    plan = planned(spec, device_total_memory=device_total_memory, device=device, sanitize=sanitize,
                   defects=tuple(sorted(defects)), prior=prior)
    ran_as = {"kernel_name": kernel_identity[0][:200], "kernel_version": kernel_identity[1][:64]} \
        if kernel_identity and kernel_identity[1] else {}
    sweep_id = repo.store_plan(session, plan, submitted_by="cli", kernel=spec.kernel, **ran_as).id
    session.commit()
    with (started(sweep_id, len(plan.configs)) if started else nullcontext()) as on_result:
        execute_sweep(session, sweep_id, backend, defects=defects, jobs=jobs, on_result=on_result, gpus=gpus,
                      time_limit_s=time_limit_s)
    if triage:
        with triaging(sweep_id) if triaging else nullcontext():
            run_triage(session, sweep_id)
    return sweep_id
