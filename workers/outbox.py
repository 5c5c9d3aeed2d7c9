"""One way in for every sweep, and the reconciler that gets every committed config run.

Submitting (`submit`: the API's POST /sweeps and rerun, the CI webhook, `attnsweep submit`):
the sweep and all its configs are committed in one transaction, each config with
`enqueued_at` null — the outbox mark "to publish". Only then are its configs published
(`publish_pending`), in bounded time (the broker's socket timeouts, one publish retry); each
published config gets `enqueued_at`. If the broker refuses or does not answer, the submission
still stands: the sweep stays `queued` and the reconciler publishes it.

The reconciler (`Reconciler.run_once`, every RECONCILE_INTERVAL_S in each worker's main process,
one at a time across workers through a lock in Redis, which a pass that fails gives up) makes
the broker agree with the store:

1. publishes every config still marked "to publish" (a sweep committed while the broker was
   down, or whose submitter died between the commit and the publish);
2. requeues configs whose task vanished: queued for longer than VANISHED_GRACE_S and found in
   no queue list and no unacknowledged delivery of the broker on two passes in a row (a task
   acknowledged without its results, a broker that lost messages). A config requeued
   MAX_ENQUEUES times is recorded `error` instead, so a batch that kills whatever runs it
   cannot keep its sweep running for ever;
3. ends `done` every active sweep none of whose configs is still queued;
4. publishes the triage task of every finished sweep whose triage is pending and unpublished
   (workers/triage.py);
5. queues again every running bisection whose worker's heartbeat stopped, and publishes the task
   of every queued bisection not yet published (workers/bisect.py).

Publishing takes row locks (FOR UPDATE SKIP LOCKED on PostgreSQL), so the submitter and the
reconciler never publish the same config twice. A config that is published twice anyway (a
crash between the publish and its commit) runs once: workers skip configs already recorded.
Sweeps of the embedded runner (`attnsweep run`: no queue) are never touched.
"""
from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping

from celery import Celery
from attnconfig import AttentionConfig, parse_config
from settings import Settings
from store import outbox as marks, repo
from store.db import Session, commit_without_flush_wait
from store.models import Sweep
from workers.app import CI_PRIORITY, PRIORITY_STEPS, SWEEP_PRIORITY, TASK_RUN_CONFIGS, redis_client
from workers.bisect import publish_pending as publish_bisections
from workers.triage import publish_pending as publish_triage
from workers.enqueue import enqueue_configs
from workers.periodic import PeriodicThread

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 10.0
VANISHED_GRACE_S = 30.0   # a config published this recently may still be on its way to a worker
MAX_ENQUEUES = 5          # publications of one config before it is recorded `error`
KOMBU_SEP = "\x06\x16"    # kombu's Redis transport: queue name + SEP + priority step
UNACKED_KEY = "unacked"   # kombu's hash of delivered, unacknowledged messages
# Delete the reconciler lock only where this owner still holds it (a lock that expired may be another's now).
_RELEASE_IF_OWNER = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


@dataclass(frozen=True)
class Submitted:
    sweep_id: int
    configs_total: int
    tasks: int              # tasks published now (0 when the broker was not reachable)
    published: bool         # every config is on the broker; else the reconciler publishes them
    replayed: bool = False  # an earlier submission (same idempotency key or delivery) answered


def priority_of(sweep: Sweep) -> int:
    return CI_PRIORITY if sweep.event else SWEEP_PRIORITY


# --- publishing --------------------------------------------------------------------------------
def publish_sweep(session: Session, celery: Celery, settings: Settings, sweep: Sweep,
                  known: Mapping[str, AttentionConfig] | None = None) -> int:
    """Publish the sweep's configs marked "to publish" and mark them published; returns the
    tasks sent. Commits. Raises whatever the broker raised (nothing is marked then). `known`:
    configs already parsed (the submitter's) by content hash, read back from the store only
    where missing."""
    rows = marks.claim_pending(session, sweep.id)
    if not rows:
        session.commit()
        return 0
    known = known or {}
    request = sweep.request or {}
    items: list[tuple[str, dict[str, Any], AttentionConfig]] = [(h, c, known.get(h) or parse_config(c)) for h, c in rows]
    try:
        tasks = enqueue_configs(celery, settings, sweep_id=sweep.id, backend=sweep.backend, configs=items,
                                defects=request.get("defects") or [], err_ratio_gate=request.get("err_ratio_gate"),
                                priority=priority_of(sweep))
    except BaseException:
        session.rollback()
        raise
    # A mark lost in a crash only publishes these configs again (the reconciler), and workers
    # skip what is stored: the commit need not wait for the disk (one flush less per POST).
    commit_without_flush_wait(session)
    return tasks


def publish_pending(session: Session, celery: Celery, settings: Settings, sweep_ids: Iterable[int] | None = None) -> int:
    """publish_sweep for every active service sweep with configs marked "to publish" (or these)."""
    if sweep_ids is None:
        sweep_ids = marks.pending_sweep_ids(session)
        session.commit()
    tasks = 0
    for sid in sweep_ids:
        sweep = marks.live_sweep(session, sid)
        if sweep is not None:
            tasks += publish_sweep(session, celery, settings, sweep)
    return tasks


# --- the one submit path -------------------------------------------------------------------------
def submit(session: Session, celery: Celery, settings: Settings, store: Callable[[Session], Sweep],
           known: Mapping[str, AttentionConfig] | None = None) -> Submitted:
    """Commit a sweep with its outbox marks, then try to publish it.

    `store(session)` writes the sweep and its configs (sweeps.plan.plan_sweep plus whatever the
    caller adds: queue, CI columns, idempotency key, delivery) without committing and returns the
    sweep; this function commits it all in one transaction, then publishes (`known`: the
    configs, parsed, by content hash). A broker that refuses or does not answer leaves the sweep queued for the
    reconciler; it is logged, not raised."""
    sweep = store(session)
    session.commit()
    sweep_id, total = sweep.id, sweep.configs_total
    try:
        tasks = publish_sweep(session, celery, settings, sweep, known)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the reconciler publishes later
        log.warning("sweep %s is committed; publishing its configs failed (%s: %s), the reconciler will",
                    sweep_id, type(exc).__name__, exc)
        return Submitted(sweep_id, total, 0, False)
    return Submitted(sweep_id, total, tasks, True)


# --- what the broker holds -----------------------------------------------------------------------
def queue_keys(settings: Settings) -> dict[str, list[str]]:
    """The Redis lists of each queue of this deployment, one per priority step."""
    out = {}
    for kind in ("cpu", "gpu"):
        q = settings.queue_name(kind)
        out[q] = [q if step == 0 else f"{q}{KOMBU_SEP}{step}" for step in PRIORITY_STEPS]
    return out


def _batch_of(message: Any) -> tuple[int, list[str]] | None:
    """(sweep_id, config hashes) of a run_configs task message as kombu stores it, else None."""
    try:
        msg = json.loads(message) if isinstance(message, (bytes, str)) else message
        if (msg.get("headers") or {}).get("task") != TASK_RUN_CONFIGS:
            return None
        body = msg["body"]
        if (msg.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return int(args[0]), [str(item[0]) for item in args[1]]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


@dataclass
class BrokerView:
    reachable: bool
    depth: dict[str, int] = field(default_factory=dict)   # waiting tasks per queue
    unacked: dict[str, int] = field(default_factory=dict)  # delivered, not yet acknowledged, per queue
    error: str | None = None


def broker_view(settings: Settings, timeout: float | None = None) -> BrokerView:
    """Queue depths and unacknowledged deliveries of this deployment's queues (cheap: LLEN and
    one pass over the unacknowledged hash)."""
    client = redis_client(settings, timeout)
    if client is None:
        return BrokerView(reachable=False, error="the broker is not Redis")
    try:
        keys = queue_keys(settings)
        pipe = client.pipeline(transaction=False)
        for lists in keys.values():
            for k in lists:
                pipe.llen(k)
        lens = iter(pipe.execute())
        depth = {q: sum(next(lens) for _ in lists) for q, lists in keys.items()}
        unacked = dict.fromkeys(keys, 0)
        for _tag, raw in client.hscan_iter(UNACKED_KEY):
            try:
                routing_key = json.loads(raw)[2]
            except (ValueError, IndexError, TypeError):
                continue
            if routing_key in unacked:
                unacked[routing_key] += 1
        return BrokerView(True, depth, unacked)
    except Exception as exc:  # noqa: BLE001 - reported as unreachable
        return BrokerView(False, error=f"{type(exc).__name__}: {exc}")
    finally:
        client.close()


def broker_inventory(settings: Settings) -> set[tuple[int, str]] | None:
    """(sweep_id, config_hash) of every config in a task of this deployment's queues, waiting or
    delivered and unacknowledged (running, or held for a retry countdown); None if the broker
    is not Redis. Raises the broker's error when it cannot be read."""
    client = redis_client(settings)
    if client is None:
        return None
    found: set[tuple[int, str]] = set()
    try:
        keys = queue_keys(settings)
        for lists in keys.values():
            for k in lists:
                for raw in client.lrange(k, 0, -1):
                    batch = _batch_of(raw)
                    if batch is not None:
                        found.update((batch[0], h) for h in batch[1])
        for _tag, raw in client.hscan_iter(UNACKED_KEY):
            try:
                message, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if routing_key in keys:
                batch = _batch_of(message)
                if batch is not None:
                    found.update((batch[0], h) for h in batch[1])
    finally:
        client.close()
    return found


# --- the reconciler ------------------------------------------------------------------------------
@dataclass
class Reconciler:
    settings: Settings
    celery: Celery
    missing_before: set[tuple[int, str]] = field(default_factory=set)
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def lock_key(self) -> str:
        return f"attnsweep:{self.settings.queue_prefix}reconciler"

    def _lock(self) -> bool:
        """One reconciler at a time per deployment: a lock in Redis that expires by itself."""
        client = redis_client(self.settings)
        if client is None:
            return True
        try:
            ttl_ms = int(RECONCILE_INTERVAL_S * 3000)
            if client.set(self.lock_key, self.owner, nx=True, px=ttl_ms):
                return True
            if client.get(self.lock_key) == self.owner.encode():
                client.pexpire(self.lock_key, ttl_ms)
                return True
            return False
        finally:
            client.close()

    def _unlock(self) -> None:
        """Give the lock up now if this reconciler holds it; with the broker away it expires by itself."""
        client = redis_client(self.settings)
        if client is None:
            return
        try:
            client.eval(_RELEASE_IF_OWNER, 1, self.lock_key, self.owner)
        except Exception as exc:  # noqa: BLE001 - the lock's expiry releases it
            log.warning("releasing the reconciler lock failed: %s: %s", type(exc).__name__, exc)
        finally:
            client.close()

    def run_once(self, session_factory: Callable[[], Session]) -> dict[str, int]:
        """One pass; returns what it did. Raises when the broker or the database cannot be reached."""
        done = {"published_tasks": 0, "requeued": 0, "given_up": 0, "finished": 0, "triage_published": 0,
                "bisections_published": 0}
        if not self._lock():
            return done
        try:
            with session_factory() as session:
                done["published_tasks"] = publish_pending(session, self.celery, self.settings)
                requeued, given_up = self._requeue_vanished(session)
                done["requeued"], done["given_up"] = requeued, given_up
                if requeued:
                    done["published_tasks"] += publish_pending(session, self.celery, self.settings)
                done["finished"] = finish_complete(session)
                # Triage tasks of finished sweeps that no one published (the broker refused, or the
                # sweep was ended here or by a process without a Celery app).
                done["triage_published"] = publish_triage(session, self.celery, self.settings)
                done["bisections_published"] = publish_bisections(session, self.celery, self.settings)
        except BaseException:
            # The next pass of another worker's reconciler may succeed where this process's
            # failed (its connections are its own); a failing holder that kept the lock, renewed
            # by each of its passes, would leave the deployment with no reconciler at all.
            self._unlock()
            raise
        return done

    def _requeue_vanished(self, session: Session) -> tuple[int, int]:
        cutoff = repo.now() - timedelta(seconds=VANISHED_GRACE_S)
        rows = marks.published_before(session, cutoff)
        session.commit()
        if not rows:
            self.missing_before = set()
            return 0, 0
        inventory = broker_inventory(self.settings)
        if inventory is None:
            return 0, 0
        missing = {(sid, h) for sid, h, _n in rows if (sid, h) not in inventory}
        confirmed = missing & self.missing_before
        self.missing_before = missing - confirmed
        if not confirmed:
            return 0, 0
        enqueues = {(sid, h): n for sid, h, n in rows}
        requeue = [k for k in confirmed if enqueues[k] < MAX_ENQUEUES]
        give_up = [k for k in confirmed if enqueues[k] >= MAX_ENQUEUES]
        marks.mark_to_publish(session, requeue)
        for sid, h in give_up:
            repo.record_result(session, sid, h, {
                "outcome": "error",
                "detail": f"its task vanished from the broker {enqueues[(sid, h)]} times without a result "
                          "(the worker running it died each time); not requeued again"})
        session.commit()
        if requeue:
            log.warning("requeueing %d configs whose tasks vanished from the broker", len(requeue))
        return len(requeue), len(give_up)


def finish_complete(session: Session) -> int:
    """End `done` every active service sweep none of whose configs is still queued."""
    ended = [sid for sid in marks.complete_sweep_ids(session) if repo.finish_if_complete(session, sid)]
    session.commit()
    from ci.notify import sweep_ended

    for sid in ended:
        sweep_ended(sid)
    return len(ended)


class ReconcilerThread(PeriodicThread):
    """Runs the reconciler every RECONCILE_INTERVAL_S in a daemon thread of the worker's main
    process; a pass that fails (broker or database away) is logged and the next one tries again."""

    def __init__(self, settings: Settings, celery: Celery, interval_s: float = RECONCILE_INTERVAL_S):
        from store.db import session_factory

        self.reconciler = Reconciler(settings, celery)
        self.sessions = session_factory(settings.database_url)
        super().__init__("attnsweep-reconciler", interval_s, self.run_pass, what="reconciler pass")

    def run_pass(self) -> None:
        t0 = time.monotonic()
        done = self.reconciler.run_once(self.sessions)
        if any(done.values()):
            log.info("reconciler: %s (%.1f s)", done, time.monotonic() - t0)
