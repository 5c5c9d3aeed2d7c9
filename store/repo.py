"""The writes and reads every execution mode shares: sweeps, queued configs, results, counts."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from attnconfig import AttentionConfig
from attnconfig.outcomes import OUTCOMES
from store.models import ConfigRun, FilterCount, Sweep


def now() -> datetime:
    return datetime.now(timezone.utc)


def config_columns(c: AttentionConfig) -> dict[str, Any]:
    """The config as ConfigRun columns (fields plus the derived ones queries group by)."""
    return {
        "config_hash": c.content_hash(),
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
) -> Sweep:
    """Store a sampled sweep with its filter counts and every accepted config, queued."""
    configs = list(configs)
    sweep = Sweep(
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
    if configs:
        session.execute(
            insert(ConfigRun),
            [{"sweep_id": sweep.id, "seq": i, "state": "queued", "attempts": 0, **config_columns(c)} for i, c in enumerate(configs)],
        )
    return sweep


def record_result(session: Session, sweep_id: int, config_hash: str, row: Mapping[str, Any], worker: str | None = None) -> None:
    """Write a config's result over its queued row: a re-run replaces, never duplicates."""
    values = {**row, "state": "done", "worker": worker, "finished_at": now(), "attempts": ConfigRun.attempts + 1}
    done = session.execute(
        update(ConfigRun).where(ConfigRun.sweep_id == sweep_id, ConfigRun.config_hash == config_hash).values(**values)
    )
    if done.rowcount != 1:
        raise LookupError(f"sweep {sweep_id} has no config {config_hash}")


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
    """SPEC §8 counts of a sweep: totals, outcomes, not-applicable reasons, filter reasons."""
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


def outcomes_by_dtype(session: Session, sweep_id: int) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for dtype, outcome, n in session.execute(
        select(ConfigRun.dtype, ConfigRun.outcome, func.count())
        .where(ConfigRun.sweep_id == sweep_id, ConfigRun.state == "done")
        .group_by(ConfigRun.dtype, ConfigRun.outcome)
    ):
        table.setdefault(dtype, dict.fromkeys(OUTCOMES, 0))[outcome] = n
    return table
