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
) -> tuple[int, SampleResult | None]:
    """Store the sweep and its accepted configs; an explicit config list skips sampling.

    `request_extra` adds what a caller stores beside the spec (the service: defects, rerun_of)."""
    budget = resolve_budget(spec, device_total_memory)
    seed = spec.resolved_seed()
    sampled = None
    if configs is None:
        sampled = sample(spec, budget.bytes)
        configs, filtered, draws = sampled.configs, sampled.filtered, sampled.draws
    else:
        filtered, draws = {}, 0
    sweep = repo.create_sweep(
        session,
        request={**spec.model_dump(mode="json"), **(request_extra or {})},
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
