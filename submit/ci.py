"""Start the sweep of a pushed commit: read its kernels/src, store the bundle, plan, enqueue first.
A commit with attnsweep.toml at its root (docs/plugins.md, "CI for any kernel repository") stores
no bundle: its sweep's kernel is `commit:SHA`, which the worker builds (kernelsrc/build.py) and
sweeps as the plug-in the file names.

One transaction holds the bundle (if new), the sweep, its configs with their outbox marks, the
delivery id and the sha256 of the signed body, so a request refused on the way stores nothing,
and two deliveries of one event cannot both start a sweep: a replay is recognised by its
delivery id or by its body (what the signature covers: the same signed body under a new
delivery id is the same event), and one racing the original hits a unique key and answers with
the first one's sweep. It is submit.sweep.submit_sweep with the CI columns added: only after
the commit are the configs published (workers.outbox.submit), with the CI priority
(workers.app) so they run before queued nightly sweeps; if the broker does not take them, the
reconciler publishes them, so a redelivery never needs to start over.

Every CI sweep is the request ATTNSWEEP_CI_SPEC plus its own settings (samples, backend, seed)
and a label naming the event; `ci_spec` validates it here, where it is built.
"""
from __future__ import annotations

from dataclasses import dataclass

from celery import Celery
from pydantic import ValidationError
from ci.events import CiEvent
from kernelsrc.git import read_kernels, read_manifest
from settings import Settings
from store.bundles import save_bundle
from store.ci import delivered_sweep, store_ci_event
from store.db import IntegrityError, Session
from store.models import Sweep
from submit.sweep import submit_sweep
from sweeps.spec import SweepSpec, SweepSpecError


@dataclass(frozen=True)
class Started:
    sweep_id: int
    replayed: bool
    configs_total: int
    tasks: int
    source_hash: str | None
    queue: str | None


def ci_label(event: CiEvent) -> str:
    where = f"#{event.pr_number}" if event.pr_number is not None else event.ref.removeprefix("refs/heads/")
    return f"ci {event.repository} {where} {event.commit_sha[:12]}"[:200]


class CiSpecError(ValueError):
    """ATTNSWEEP_CI_SPEC with the CI settings is not a valid sweep request: a deployment's mistake."""


def ci_spec(settings: Settings, event: CiEvent | None = None) -> SweepSpec:
    """The request of `event`'s CI sweep (without an event: the deployment's, to check at start)."""
    label = ci_label(event) if event is not None else "ci"
    try:
        return SweepSpec.model_validate({**settings.ci_spec, "samples": settings.ci_samples, "backend": settings.ci_backend,
                                         "seed": settings.ci_seed, "label": label})
    except (ValidationError, SweepSpecError) as exc:
        raise CiSpecError(f"ATTNSWEEP_CI_SPEC: {exc}") from None


def _replay(session: Session, delivery_id: str, body_sha256: str | None = None) -> Started | None:
    sweep = delivered_sweep(session, delivery_id, body_sha256)
    if sweep is None:
        return None
    return Started(sweep.id, True, sweep.configs_total, 0, sweep.source_hash, sweep.queue)


def start_ci_sweep(session: Session, celery: Celery, settings: Settings, event: CiEvent, delivery_id: str,
                   body_sha256: str | None = None) -> Started:
    """The sweep of `event`'s commit (a new one, or the one this delivery or body started before).

    Raises kernelsrc.git.KernelRepoError when kernels/src cannot be read at the commit,
    kernelsrc.manifest.ManifestError when its attnsweep.toml breaks a rule, CiSpecError
    when the CI settings make no valid request, submit.sweep.SubmitError when they sample too few configs
    (nothing stored in each case). A broker that does not take the configs leaves them to the
    reconciler."""
    replay = _replay(session, delivery_id, body_sha256)
    if replay is not None:
        return replay
    spec = ci_spec(settings, event)
    source = None
    if read_manifest(settings.kernel_repo, event.commit_sha, settings.kernel_repo_cache) is None:
        source = read_kernels(settings.kernel_repo, event.commit_sha, settings.kernel_repo_cache)
    else:
        spec = spec.model_copy(update={"kernel": f"commit:{event.commit_sha}"})
    request_extra = {"ci": {"event": event.event, "repository": event.repository, "ref": event.ref,
                            "commit_sha": event.commit_sha, "delivery": delivery_id}}
    if event.before is not None:
        # Where the push's commits start: its new failures are bisected from here (workers/bisect.py).
        request_extra["ci"]["before"] = event.before

    def also_store(s: Session, sweep: Sweep) -> None:
        store_ci_event(s, sweep, delivery_id=delivery_id, body_sha256=body_sha256, event=event.event,
                       repository=event.repository, ref=event.ref, commit_sha=event.commit_sha, base_ref=event.base_ref,
                       pr_number=event.pr_number, source_hash=save_bundle(s, source) if source is not None else None)

    try:
        done = submit_sweep(session, celery, settings, spec, extra_request=request_extra,
                            also_store=also_store, submitted_by="webhook")
    except IntegrityError:
        # Two deliveries of one event raced: the first one's commit won; answer with its sweep.
        session.rollback()
        replay = _replay(session, delivery_id, body_sha256)
        if replay is None:
            raise
        return replay
    sweep = done.sweep
    return Started(sweep.id, False, sweep.configs_total, done.tasks, sweep.source_hash, sweep.queue)
