"""Publishing a stored sweep's configs: full batches of `task_batch_size`, in kernel-variant order.

Configs are ordered by the variant the GPU backends would compile (kernels.select.select_variant:
dtype, head-dim buckets, defects), keeping their sampled order inside a variant, and cut into
batches of `task_batch_size`: a variant's configs sit together, so a worker compiles it once per
batch it is in, and every batch but the last is full. Each task is a broker round trip inside
POST /sweeps; a batch per variant made a 20-config sampled sweep (about as many variants as
configs) 19 tasks, and its publishing most of the request's time.
"""
from __future__ import annotations

from typing import Any, Sequence

from celery import Celery

from attnconfig import AttentionConfig
from settings import Settings
from kernels.select import variant_key
from workers.app import SWEEP_PRIORITY, TASK_RUN_CONFIGS, queue_kind

Item = tuple[str, dict[str, Any]]  # (config_hash, config as JSON): what a task carries per config


def items_of(configs: Sequence[AttentionConfig]) -> list[tuple[str, dict[str, Any], AttentionConfig]]:
    return [(c.content_hash(), c.to_dict(), c) for c in configs]


def batches(configs: Sequence[AttentionConfig] | Sequence[tuple[str, dict[str, Any], AttentionConfig]], size: int,
            defects: Sequence[str] = ()) -> list[list[Item]]:
    """Configs (or (hash, dict, config) triples already computed) in variant order, cut into
    batches of `size`."""
    triples = items_of(configs) if configs and isinstance(configs[0], AttentionConfig) else list(configs)
    keyed = sorted(((variant_key(c, defects), i, h, d) for i, (h, d, c) in enumerate(triples)), key=lambda t: (t[0], t[1]))
    members = [(h, d) for _k, _i, h, d in keyed]
    return [members[i:i + size] for i in range(0, len(members), size)]


def enqueue_configs(celery: Celery, settings: Settings, *, sweep_id: int, backend: str,
                    configs: Sequence[AttentionConfig] | Sequence[tuple[str, dict[str, Any], AttentionConfig]],
                    defects: Sequence[str] = (), err_ratio_gate: float | None = None,
                    priority: int = SWEEP_PRIORITY) -> int:
    """Publish the configs of a committed sweep to its queue; returns the number of tasks.

    `priority` is the message priority (workers.app: CI_PRIORITY goes before SWEEP_PRIORITY)."""
    queue = settings.queue_name(queue_kind(backend))
    tasks = batches(configs, settings.task_batch_size, defects)
    with celery.producer_or_acquire() as producer:
        for batch in tasks:
            # A short argsrepr (what Flower and the logs show) instead of Celery's repr of every config.
            celery.send_task(TASK_RUN_CONFIGS, args=(sweep_id, batch, backend, sorted(defects), err_ratio_gate),
                             queue=queue, producer=producer, priority=priority, kwargsrepr="{}",
                             argsrepr=f"(sweep={sweep_id}, configs={len(batch)}, backend={backend!r})")
    return len(tasks)


def _defect_names() -> tuple[str, ...]:
    from kernels.backends.base import DEFECTS

    return tuple(DEFECTS)


DEFECT_NAMES = _defect_names()
