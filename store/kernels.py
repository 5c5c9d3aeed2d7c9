"""The kernel under test in the store: which kernel a sweep runs (kernels/plugins), the name and
version it ran as, and sweeps of several kernels side by side (`attnsweep compare`, the
dashboard's comparison)."""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from statistics import median
from typing import Any, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from attnconfig.outcomes import FAILING_OUTCOMES
from store.models import ConfigRun, Sweep

ONLY_ONE_SHOWN = 200   # configs failing on one kernel only, listed at most
RAN = ("pass", "fail", "nan")   # outcomes whose kernel time is a kernel's time


def sweep_kernel(session: Session, sweep_id: int) -> str:
    """The kernel a sweep asked for (`--kernel`; "attnsweep" for sweeps stored before plug-ins)."""
    return session.scalar(select(Sweep.kernel).where(Sweep.id == sweep_id)) or "attnsweep"


def note_kernel(session: Session, sweep_id: int, name: str, version: str | None) -> None:
    """Store the name and version a sweep's kernel ran as, where none is stored yet (the first
    result that says wins; a worker of another version does not rewrite it)."""
    session.execute(update(Sweep).where(Sweep.id == sweep_id, Sweep.kernel_name.is_(None))
                    .values(kernel_name=name[:200], kernel_version=(version or None) and version[:64]))


def kernel_comparison(session: Session, sweep_ids: Sequence[int]) -> dict[str, Any]:
    """The sweeps side by side, one entry per sweep in the order given:
    - `sweeps`: id, kernel (as asked), kernel_name, kernel_version, backend, device, seed, status,
      configs, outcomes {outcome: n}, not_applicable {reason: n}, and over the configs it ran that
      another kernel ran too: time_ratio_median and time_ratio_geomean (its kernel time over the
      fastest of the kernels that ran the config), timed (how many) and fastest (configs where it
      was the fastest);
    - `only_one`: configs that fail on exactly one kernel while every other ran them without a
      failure (config, sweep, outcome, gate, the others' outcomes), at most ONLY_ONE_SHOWN;
    - `common`: configs present in every sweep; `ran_by_all`: of those, run by every kernel.
    Raises LookupError naming a sweep that does not exist."""
    ids = list(dict.fromkeys(sweep_ids))
    found = {s.id: s for s in session.scalars(select(Sweep).where(Sweep.id.in_(ids)))}
    missing = [i for i in ids if i not in found]
    if missing:
        raise LookupError(f"sweep {missing[0]}: no such sweep")
    outcomes: dict[int, Counter[str]] = {i: Counter() for i in ids}
    reasons: dict[int, Counter[str]] = {i: Counter() for i in ids}
    for sweep_id, outcome, reason, n in session.execute(
            select(ConfigRun.sweep_id, ConfigRun.outcome, ConfigRun.not_applicable_reason, func.count())
            .where(ConfigRun.sweep_id.in_(ids))
            .group_by(ConfigRun.sweep_id, ConfigRun.outcome, ConfigRun.not_applicable_reason)):
        outcomes[sweep_id][outcome or "queued"] += n
        if outcome == "not_applicable":
            reasons[sweep_id][reason or "unknown"] += n
    per_config: dict[str, dict[int, tuple[str | None, str | None, float | None]]] = defaultdict(dict)
    configs: dict[str, dict[str, Any]] = {}
    for sweep_id, h, outcome, gate, run_s, config in session.execute(
            select(ConfigRun.sweep_id, ConfigRun.config_hash, ConfigRun.outcome, ConfigRun.failed_gate,
                   ConfigRun.run_s, ConfigRun.config).where(ConfigRun.sweep_id.in_(ids))):
        per_config[h][sweep_id] = (outcome, gate, run_s)
        configs.setdefault(h, config)
    common = [h for h, by in per_config.items() if len(by) == len(ids)]
    ratios: dict[int, list[float]] = {i: [] for i in ids}
    fastest: Counter[int] = Counter()
    only_one = []
    ran_by_all = 0
    for h in common:
        by = per_config[h]
        times = {i: t for i, (o, _g, t) in by.items() if o in RAN and t and t > 0}
        ran_by_all += len(times) == len(ids)
        if len(times) >= 2:   # kernels support different configs: each ratio is to the fastest that ran it
            best = min(times.values())
            for i, t in times.items():
                ratios[i].append(t / best)
            fastest[min(times, key=times.get)] += 1
        failing = [i for i, (o, _g, _t) in by.items() if o in FAILING_OUTCOMES]
        if len(failing) == 1 and all(by[i][0] == "pass" for i in ids if i != failing[0]):
            i = failing[0]
            only_one.append({"config_hash": h, "config": configs[h], "sweep_id": i, "kernel": found[i].kernel,
                             "outcome": by[i][0], "failed_gate": by[i][1],
                             "others": {str(j): by[j][0] for j in ids if j != i}})
    rows = []
    for i in ids:
        s = found[i]
        r = ratios[i]
        rows.append({
            "id": i, "kernel": s.kernel, "kernel_name": s.kernel_name or s.kernel, "kernel_version": s.kernel_version,
            "backend": s.backend, "device": s.device, "seed": s.seed, "status": s.status,
            "configs": sum(outcomes[i].values()), "outcomes": dict(outcomes[i]), "not_applicable": dict(reasons[i]),
            "time_ratio_median": median(r) if r else None,
            "time_ratio_geomean": math.exp(sum(map(math.log, r)) / len(r)) if r else None,
            "timed": len(r), "fastest": fastest[i],
        })
    return {"sweeps": rows, "common": len(common), "ran_by_all": ran_by_all,
            "only_one": only_one[:ONLY_ONE_SHOWN], "only_one_total": len(only_one)}
