"""A small sampled cpu sweep with a defect switch, stored in SQLite by the embedded runner."""
from __future__ import annotations

from typing import Any

from store.db import unit_of_work
from store.migrate import upgrade
from submit.sweep import run_sweep
from sweeps.spec import SweepSpec
from workers.triage import run_triage

# Small problems (the cpu backend runs them in milliseconds) that still reach every split
# regime: up to 300 keys (10 blocks of 32) against up to 16 splits. Head dims from 8: below,
# the row gate fails correct kernels (sweeps/policy.py), which would be a cluster of its own.
RANGES = {"g": [1, 4], "seq_len_q": [1, 16], "seq_len_k": [1, 300], "num_heads_q": [1, 4], "num_heads_kv": [1, 4],
          "head_dim_qk": [8, 64], "head_dim_v": [8, 64], "split_kv": [1, 16]}


def defect_sweep(url: str, defect: str, samples: int, seed: int = 5, time_limit_s: float | None = None) -> int:
    """The default regime mix draws the large logits a data-triggered defect (DATA_DEFECTS) needs."""
    upgrade(url)
    return run_at(url, SweepSpec(samples=samples, seed=seed, backend="cpu", ranges=RANGES), backend="cpu",
                  device_total_memory=None, device=None, defects=frozenset({defect}), time_limit_s=time_limit_s)


def run_at(url: str, spec: SweepSpec, **kwargs: Any) -> int:
    """submit.sweep.run_sweep in a unit of work of its own at `url`, as `attnsweep run` opens one."""
    with unit_of_work(url) as session:
        return run_sweep(session, spec, **kwargs)


def triage_at(url: str, sweep_id: int, *args: Any, **kwargs: Any) -> str:
    """workers.triage.run_triage in a unit of work of its own at `url`, as the triage task opens one."""
    with unit_of_work(url) as session:
        return run_triage(session, sweep_id, *args, **kwargs)
