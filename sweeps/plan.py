"""Plan a sweep: resolve the split-KV budget, sample and prefilter, store it queued."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from attnconfig import AttentionConfig
from store import repo
from sweeps.filters import splitkv_budget
from sweeps.sampler import SampleResult, sample
from sweeps.spec import SweepSpec


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str  # "request", "device" (total memory of the target), "fallback"


def resolve_budget(spec: SweepSpec, device_total_memory: int | None) -> Budget:
    if spec.splitkv_extra_bytes_limit is not None:
        return Budget(spec.splitkv_extra_bytes_limit, "request")
    source = "device" if device_total_memory is not None else "fallback"
    return Budget(splitkv_budget(device_total_memory, None), source)


def plan_sweep(
    session: Session,
    spec: SweepSpec,
    *,
    device_total_memory: int | None,
    device: str | None,
    configs: list[AttentionConfig] | None = None,
    request_extra: dict[str, Any] | None = None,
    sanitize: tuple[str, float] | None = None,
    defects: tuple[str, ...] = (),
) -> tuple[int, SampleResult | None]:
    """Store the sweep and its accepted configs; an explicit config list skips sampling.

    `request_extra` adds what a caller stores beside the spec (the service: defects, rerun_of).
    `sanitize`: (compute-sanitizer tool, share of the configs): the configs it picks
    (workers/sanitize.py, stratified by kernel variant) are stored in the request, where every
    worker reads them."""
    budget = resolve_budget(spec, device_total_memory)
    seed = spec.resolved_seed()
    sampled = None
    if configs is None:
        sampled = sample(spec, budget.bytes)
        configs, filtered, draws = sampled.configs, sampled.filtered, sampled.draws
    else:
        filtered, draws = {}, 0
    extra = dict(request_extra or {})
    if sanitize is not None:
        tool, share = sanitize
        extra.update(sanitize=tool, sanitize_share=share, sanitize_configs=pick_configs(configs, share, defects))
    sweep = repo.create_sweep(
        session,
        request={**spec.model_dump(mode="json"), **extra},
        seed=seed,
        backend=spec.backend,
        label=spec.label,
        splitkv_budget=budget.bytes,
        budget_source=budget.source,
        device=device,
        draws=draws,
        filtered=filtered,
        configs=configs,
    )
    return sweep.id, sampled


def pick_configs(configs: list[AttentionConfig], share: float, defects: tuple[str, ...] = ()) -> list[str]:
    """Hashes of ceil(share * n) configs of each kernel variant (the first in hash order): the
    configs a sweep runs under compute-sanitizer, every variant checked at least once."""
    import math
    from collections import defaultdict

    from kernels.select import variant_key

    by_variant: dict[str, list[str]] = defaultdict(list)
    for c in configs:
        by_variant[variant_key(c, defects)].append(c.content_hash())
    picked: list[str] = []
    for hashes in by_variant.values():
        hashes.sort()
        picked.extend(hashes[:max(1, math.ceil(share * len(hashes)))])
    return sorted(picked)
