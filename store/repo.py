"""The writes and reads every execution mode shares: sweeps, queued configs, results, counts."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from sqlalchemy import bindparam, case, func, insert, select, update
from sqlalchemy.orm import Session

from attnconfig import AttentionConfig
from attnconfig.outcomes import OUTCOMES
from store.models import ConfigRun, FilterCount, Sweep, SweepTriage, Worker

if TYPE_CHECKING:
    from sweeps.plan import SweepPlan


def now() -> datetime:
    return datetime.now(timezone.utc)


def aware(t: datetime) -> datetime:
    """A stored time as UTC: SQLite hands back naive datetimes, PostgreSQL aware ones."""
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def config_columns(c: AttentionConfig, content_hash: str | None = None) -> dict[str, Any]:
    """The config as ConfigRun columns (fields plus the derived ones queries group by);
    `content_hash`: c.content_hash(), where the caller has it already."""
    return {
        "config_hash": content_hash or c.content_hash(),
        "config": c.to_dict(),
        "dtype": c.dtype,
        "g": c.g,
        "seq_len_q": c.seq_len_q,
        "seq_len_k": c.seq_len_k,
        "num_heads_q": c.num_heads_q,
        "num_heads_kv": c.num_heads_kv,
        "gqa_ratio": c.gqa_ratio,
        "head_dim_qk": c.head_dim_qk,
        "head_dim_v": c.head_dim_v,
        "with_attn_scale": c.with_attn_scale,
        "with_attn_bias": c.with_attn_bias,
        "causal": c.causal,
        "has_prefix_offset": c.prefix_offset is not None,
        "kv_cache": c.current_seq_len is not None,
        "trans_q": c.trans_q,
        "trans_k": c.trans_k,
        "trans_v": c.trans_v,
        "trans_o": c.trans_o,
        "return_lse": c.return_lse,
        "split_kv": c.split_kv,
        "data_seed": c.data_seed,
        "data_regime": c.data_regime,
    }


def create_sweep(
    session: Session,
    *,
    request: Mapping[str, Any],
    seed: int,
    backend: str,
    label: str | None,
    splitkv_budget: int,
    budget_source: str,
    device: str | None,
    draws: int,
    filtered: Mapping[str, int],
    configs: Iterable[AttentionConfig],
    columns: Mapping[str, Any] | None = None,
    hashes: Sequence[str] | None = None,
) -> Sweep:
    """Store a sampled sweep with its filter counts and every accepted config, queued.
    `columns`: more of the sweep's columns (a service sweep's queue), in the same INSERT;
    `hashes`: the configs' content hashes, where the caller has them."""
    configs = list(configs)
    hashes = list(hashes) if hashes else [c.content_hash() for c in configs]
    sweep = Sweep(
        **(columns or {}),
        label=label,
        status="queued",
        seed=seed,
        backend=backend,
        request=dict(request),
        samples=len(configs),
        draws=draws,
        configs_total=len(configs),
        splitkv_budget=splitkv_budget,
        budget_source=budget_source,
        device=device,
    )
    session.add(sweep)
    session.flush()
    for reason, count in sorted(filtered.items()):
        session.add(FilterCount(sweep_id=sweep.id, reason=reason, count=count))
    bulk_add_configs(session, sweep.id, [config_columns(c, h) for c, h in zip(configs, hashes)])
    return sweep


def store_plan(session: Session, plan: "SweepPlan", **columns: Any) -> Sweep:
    """Store a planned sweep (sweeps.plan.plan_sweep), queued, with more of its `columns`; the
    caller commits."""
    return create_sweep(session, request=plan.request, seed=plan.seed, backend=plan.backend, label=plan.label,
                        splitkv_budget=plan.budget.bytes, budget_source=plan.budget.source, device=plan.device,
                        draws=plan.draws, filtered=plan.filtered, configs=plan.configs, columns=columns,
                        hashes=plan.hashes)


def record_result(session: Session, sweep_id: int, config_hash: str, row: Mapping[str, Any], worker: str | None = None,
                  *, clear_start: bool = False) -> bool:
    """Store a config's result over its queued row, unless a result is stored already (first
    write wins). False when this one came late and was discarded."""
    return not record_results(session, sweep_id, [(config_hash, row, worker)], clear_start=clear_start)


def record_results(session: Session, sweep_id: int, results: Sequence[tuple[str, Mapping[str, Any], str | None]],
                   *, clear_start: bool = False) -> list[str]:
    """record_result for several (config_hash, row, worker) in one statement, executed once per
    row (executemany). Building an ORM UPDATE of some forty columns costs about 2 ms a row in
    SQLAlchemy and its execution 0.1 ms: the embedded pool's parent stores hundreds a second at
    the end of a sweep. A column one row names and another does not is written NULL in the
    other (ConfigResult.to_row names every column).

    A stored result is final: the update is a compare-and-set on the row's state, so a config
    already `done` keeps its result and a late or repeated run (a worker that woke after its
    task's lease went to another, a batch delivered twice) changes nothing but `attempts`,
    which counts every result that arrived. Returns the hashes of those discarded results.
    `clear_start`: these results end runs that begin_config marked, and the marks go with them.
    Raises LookupError naming the configs the sweep does not have (and writes none of them, as
    the caller's transaction rolls back)."""
    if not results:
        return []
    table = ConfigRun.__table__
    hashes = [h for h, _row, _w in results]
    states = dict(session.execute(select(table.c.config_hash, table.c.state).where(
        table.c.sweep_id == sweep_id, table.c.config_hash.in_(hashes)).with_for_update()).all())
    missing = [h for h in hashes if h not in states]
    if missing:
        raise LookupError(f"sweep {sweep_id} has no config {', '.join(missing)}")
    late = [h for h in hashes if states[h] == "done"]
    fresh = [r for r in results if states[r[0]] != "done"]
    if fresh:
        keys = sorted({k for _h, row, _w in fresh for k in row})
        values = {**{k: bindparam("v_" + k, type_=table.c[k].type) for k in keys},
                  "state": "done", "worker": bindparam("p_worker"), "finished_at": bindparam("p_finished_at"),
                  "attempts": table.c.attempts + 1}
        if clear_start:
            values["starts"] = case((table.c.starts > 0, table.c.starts - 1), else_=0)
        stmt = (update(table)
                .where(table.c.sweep_id == bindparam("p_sweep_id"), table.c.config_hash == bindparam("p_config_hash"),
                       table.c.state != "done")
                .values(values))
        session.connection().execute(stmt, [
            {"p_sweep_id": sweep_id, "p_config_hash": h, "p_worker": worker, "p_finished_at": now(),
             **{"v_" + k: row.get(k) for k in keys}} for h, row, worker in fresh])
    if late:
        session.execute(update(ConfigRun).where(ConfigRun.sweep_id == sweep_id, ConfigRun.config_hash.in_(late))
                        .values(attempts=ConfigRun.attempts + 1))
    return late


def set_status(session: Session, sweep_id: int, status: str, error: str | None = None) -> None:
    values: dict[str, Any] = {"status": status}
    if status == "running":
        values["started_at"] = now()
    if status in ("done", "failed", "cancelled"):
        values["finished_at"] = now()
    if error is not None:
        values["error"] = error
    session.execute(update(Sweep).where(Sweep.id == sweep_id).values(**values))


def queued_configs(session: Session, sweep_id: int) -> list[tuple[str, dict[str, Any]]]:
    """(config_hash, config) of every config of the sweep not yet done, in sampled order."""
    rows = session.execute(
        select(ConfigRun.config_hash, ConfigRun.config)
        .where(ConfigRun.sweep_id == sweep_id, ConfigRun.state != "done")
        .order_by(ConfigRun.seq)
    )
    return [(h, c) for h, c in rows]


def sweep_counts(session: Session, sweep_id: int) -> dict[str, Any]:
    """docs/spec.md §8 counts of a sweep: totals, outcomes, not-applicable reasons, filter reasons."""
    outcomes = dict.fromkeys(OUTCOMES, 0)
    for outcome, n in session.execute(
        select(ConfigRun.outcome, func.count()).where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "done").group_by(ConfigRun.outcome)
    ):
        outcomes[outcome] = n
    reasons = {
        r: n
        for r, n in session.execute(
            select(ConfigRun.not_applicable_reason, func.count())
            .where(ConfigRun.sweep_id == sweep_id, ConfigRun.outcome == "not_applicable")
            .group_by(ConfigRun.not_applicable_reason)
        )
    }
    filtered = {r: n for r, n in session.execute(select(FilterCount.reason, FilterCount.count).where(FilterCount.sweep_id == sweep_id))}
    total = session.scalar(select(func.count()).select_from(ConfigRun).where(ConfigRun.sweep_id == sweep_id)) or 0
    return {
        "configs_total": total,
        "configs_done": sum(outcomes.values()),
        "outcomes": outcomes,
        "not_applicable_reasons": reasons,
        "filtered": filtered,
    }


def results_by_worker(session: Session, sweep_id: int) -> dict[str, int]:
    """Finished configs of a sweep per worker that stored them (per GPU for `run --gpus`)."""
    rows = session.execute(select(ConfigRun.worker, func.count())
                           .where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "done").group_by(ConfigRun.worker))
    return {worker or "?": n for worker, n in sorted(rows, key=lambda r: r[0] or "")}


def outcomes_by_dtype(session: Session, sweep_id: int) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for dtype, outcome, n in session.execute(
        select(ConfigRun.dtype, ConfigRun.outcome, func.count())
        .where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "done")
        .group_by(ConfigRun.dtype, ConfigRun.outcome)
    ):
        table.setdefault(dtype, dict.fromkeys(OUTCOMES, 0))[outcome] = n
    return table


# --- service mode: sweep life cycle driven by workers -------------------------------------------
ACTIVE_STATUSES = ("queued", "running")


def sweep_status(session: Session, sweep_id: int) -> str | None:
    return session.scalar(select(Sweep.status).where(Sweep.id == sweep_id))


def pending_hashes(session: Session, sweep_id: int, hashes: Iterable[str]) -> set[str]:
    """Which of these configs of the sweep are still queued (not done, not cancelled)."""
    hashes = list(hashes)
    if not hashes:
        return set()
    rows = session.scalars(
        select(ConfigRun.config_hash).where(
            ConfigRun.sweep_id == sweep_id, ConfigRun.state == "queued", ConfigRun.config_hash.in_(hashes)
        )
    )
    return set(rows)


def begin_config(session: Session, sweep_id: int, config_hash: str, count: bool = True) -> int | None:
    """Mark a queued config's kernel as launched, before the launch: `starts` counts the runs of
    it that have not come back, so a mark still there when the config is begun again is a
    process that died while running it. The result's write clears the mark (record_results'
    clear_start). Returns the marks, this one included; None when the config is no longer
    queued (another worker stored it, or its sweep was cancelled). `count=False` reads them
    without marking (a run whose result was computed but could not be written)."""
    if count:
        session.execute(update(ConfigRun).where(
            ConfigRun.sweep_id == sweep_id, ConfigRun.config_hash == config_hash, ConfigRun.state == "queued",
        ).values(starts=ConfigRun.starts + 1))
    starts = session.scalar(select(ConfigRun.starts).where(
        ConfigRun.sweep_id == sweep_id, ConfigRun.config_hash == config_hash, ConfigRun.state == "queued"))
    return None if starts is None else int(starts)


def mark_running(session: Session, sweep_id: int) -> None:
    """queued -> running, once: the first worker that starts a config of the sweep."""
    session.execute(
        update(Sweep).where(Sweep.id == sweep_id, Sweep.status == "queued").values(status="running", started_at=now())
    )


def finish_if_complete(session: Session, sweep_id: int) -> bool:
    """running -> done when no config of the sweep is queued any more, its triage pending. Call
    after committing a result.

    Every worker checks after its own commit, so the worker whose result was the last one to
    commit always sees none queued: no sweep stays running with all its configs done.
    """
    left = session.scalar(
        select(ConfigRun.id).where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "queued").limit(1)
    )
    if left is not None:
        return False
    done = session.execute(
        update(Sweep)
        .where(Sweep.id == sweep_id, Sweep.status.in_(ACTIVE_STATUSES))
        .values(status="done", finished_at=now())
    )
    if done.rowcount != 1:
        return False
    # The sweep's triage is owed in the same transaction that ends it, so no finished sweep is
    # left without one (store/clusters.py); a worker computes it (workers/triage.py).
    if session.get(SweepTriage, sweep_id) is None:
        session.add(SweepTriage(sweep_id=sweep_id, status="pending"))
        session.flush()
    return True


def sweep_sanitize(session: Session, sweep_id: int) -> tuple[str, frozenset[str]] | None:
    """(compute-sanitizer tool, hashes of the configs picked for it) of a sweep, or None."""
    request = session.scalar(select(Sweep.request).where(Sweep.id == sweep_id)) or {}
    if not request.get("sanitize"):
        return None
    return request["sanitize"], frozenset(request.get("sanitize_configs") or ())


def sweep_revision(session: Session, sweep_id: int) -> tuple[str | None, str | None]:
    """(source_hash, commit_sha) of a sweep: the bundle it tests (None: the workers' own kernels/src)."""
    row = session.execute(select(Sweep.source_hash, Sweep.commit_sha).where(Sweep.id == sweep_id)).first()
    return (row[0], row[1]) if row is not None else (None, None)


def cancel_sweep(session: Session, sweep_id: int) -> int:
    """Mark a queued or running sweep cancelled and its queued configs skipped; returns how many."""
    set_status(session, sweep_id, "cancelled")
    skipped = session.execute(
        update(ConfigRun).where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "queued").values(state="cancelled")
    )
    return skipped.rowcount


# --- service mode: workers -----------------------------------------------------------------------
def register_worker(session: Session, name: str, **fields: Any) -> None:
    """Insert or refresh a worker's row (a restarted worker keeps its name)."""
    values = {**fields, "last_heartbeat": now(), "started_at": now(), "stopped_at": None}
    worker = session.get(Worker, name)
    if worker is None:
        session.add(Worker(name=name, **values))
    else:
        for key, value in values.items():
            setattr(worker, key, value)


def heartbeat(session: Session, name: str, stopped: bool = False) -> None:
    values: dict[str, Any] = {"last_heartbeat": now()}
    if stopped:
        values["stopped_at"] = now()
    session.execute(update(Worker).where(Worker.name == name).values(**values))


def live_workers(session: Session, stale_after_s: float, queue: str | None = None) -> list[Any]:
    """Workers that are not stopped and heartbeat within `stale_after_s`, optionally of one queue."""
    from datetime import timedelta

    q = select(Worker).where(Worker.stopped_at.is_(None), Worker.last_heartbeat >= now() - timedelta(seconds=stale_after_s))
    if queue is not None:
        q = q.where(Worker.queue == queue)
    return list(session.scalars(q.order_by(Worker.name)))


# Two columns of a queue's live workers, built once: every POST /sweeps asks.
_QUEUE_MEMORY = (select(Worker.total_memory, Worker.device)
                 .where(Worker.stopped_at.is_(None), Worker.last_heartbeat >= bindparam("p_since"),
                        Worker.queue == bindparam("p_queue"))
                 .order_by(Worker.name))


def queue_device_memory(session: Session, queue: str, stale_after_s: float) -> tuple[int | None, str | None]:
    """(smallest total memory, that device's name) among the live workers of a queue.

    The smallest device decides, since any worker of the queue may take any config. The memory
    is None when no live worker of the queue reported one (no worker, or cpu workers); the
    device is then that of a live worker, if any. Two columns, not the workers' rows: every
    POST /sweeps asks.
    """
    from datetime import timedelta

    live = session.execute(_QUEUE_MEMORY, {"p_since": now() - timedelta(seconds=stale_after_s), "p_queue": queue}).all()
    reported = [w for w in live if w.total_memory]
    if not reported:
        return None, (live[0].device if live else None)
    smallest = min(reported, key=lambda w: w.total_memory)
    return smallest.total_memory, smallest.device


# --- service mode: a large sweep's configs in one round trip ------------------------------------
def bulk_add_configs(session: Session, sweep_id: int, rows: list[dict[str, Any]]) -> None:
    """Insert a sweep's configs, queued, from `config_columns` rows (create_sweep's insert).

    PostgreSQL gets one COPY (about ten times faster than an executemany of 10,000 rows, which
    keeps POST /sweeps of a large sweep within its budget); other databases an executemany.
    Runs in the session's transaction.
    """
    import json

    if not rows:
        return
    columns = ["sweep_id", "seq", "state", "attempts", *rows[0].keys()]
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        session.execute(insert(ConfigRun), [{"sweep_id": sweep_id, "seq": i, "state": "queued", "attempts": 0, **r}
                                            for i, r in enumerate(rows)])
        return
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(f"COPY config_runs ({', '.join(columns)}) FROM STDIN") as copy:
        for i, r in enumerate(rows):
            copy.write_row((sweep_id, i, "queued", 0, *(json.dumps(v) if k == "config" else v for k, v in r.items())))
