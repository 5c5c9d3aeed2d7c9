"""Plan a sweep: resolve the split-KV budget, sample and prefilter; what to store, stored by store.repo."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnconfig import AttentionConfig
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


@dataclass(frozen=True)
class SweepPlan:
    """What to store for a sweep (store.repo.store_plan): its request, budget and accepted configs."""

    request: dict[str, Any]   # the spec as JSON, plus what the caller stores beside it
    seed: int
    backend: str
    label: str | None
    budget: Budget
    device: str | None
    configs: list[AttentionConfig]
    draws: int = 0                                          # 0: an explicit config list, not sampled
    filtered: dict[str, int] = field(default_factory=dict)  # configs each prefilter dropped
    # configs[i].content_hash(), computed once: sampling dedupes by it, the store keys rows by it
    # and publishing names each config by it (a JSON dump and a sha256 each).
    hashes: list[str] = field(default_factory=list)


def plan_sweep(
    spec: SweepSpec,
    *,
    device_total_memory: int | None,
    device: str | None = None,
    configs: list[AttentionConfig] | None = None,
    request_extra: dict[str, Any] | None = None,
    sanitize: tuple[str, float] | None = None,
    defects: tuple[str, ...] = (),
    prior: Any = None,
) -> SweepPlan:
    """The sweep to store: its budget resolved, its configs sampled and prefiltered (an explicit
    config list skips sampling). Raises sweeps.sampler.SamplingExhausted.

    `request_extra` adds what a caller stores beside the spec (the service: defects, rerun_of).
    `sanitize`: (compute-sanitizer tool, share of the configs): the configs it picks
    (pick_configs, stratified by kernel variant) are stored in the request, where every worker
    reads them. `prior`: the sweeps.coverage.CellCounts a coverage-guided draw adds to its own
    (sweeps.sampler.sample)."""
    budget = resolve_budget(spec, device_total_memory)
    filtered: dict[str, int] = {}
    draws = 0
    if configs is None:
        sampled: SampleResult = sample(spec, budget.bytes, prior=prior)
        configs, filtered, draws, hashes = sampled.configs, sampled.filtered, sampled.draws, sampled.accepted_hashes
    else:
        hashes = [c.content_hash() for c in configs]
    extra = dict(request_extra or {})
    if sanitize is not None:
        tool, share = sanitize
        extra.update(sanitize=tool, sanitize_share=share, sanitize_configs=pick_configs(configs, share, defects))
    return SweepPlan(request={**spec.model_dump(mode="json"), **extra}, seed=spec.resolved_seed(), backend=spec.backend,
                     label=spec.label, budget=budget, device=device, configs=list(configs), draws=draws,
                     filtered=dict(filtered), hashes=list(hashes))


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
