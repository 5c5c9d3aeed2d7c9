"""Sweeps with a planted failure pattern, stored through the code paths the workers use.

Every result is a `ConfigResult` whose verdict comes from `sweeps.policy.evaluate` (or an
error/not-applicable outcome) with a real reproducer, written by `repo.record_result`; the
sweep's status moves through `repo.mark_running` and `repo.finish_if_complete` as a worker's.

The planted pattern: every failure is dtype=bf16 with split_kv >= 16; nothing else fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnconfig import AttentionConfig, parse_config
from attnconfig.outcomes import METRIC_KEYS
from store import repo
from store.db import session_scope
from sweeps.policy import evaluate, gates_for, rms_threshold
from sweeps.result import ConfigResult, reproducer_command

DTYPES = ("f16", "bf16", "f32", "i8")
SPLITS = (1, 2, 4, 8, 16, 32)
SEQ_LEN_K = (64, 300, 1024)  # one per power-of-two bucket: 64-127, 256-511, 1024-2047
FILTERED = {"max_tokens": 41, "splitkv_extra_bytes": 7, "reference_flops": 3, "duplicate": 2}


def planted(c: AttentionConfig) -> bool:
    return c.dtype == "bf16" and c.split_kv >= 16


def not_applicable(c: AttentionConfig) -> bool:
    return c.dtype == "f32" and c.split_kv == 32 and c.seq_len_k < 1024


def grid() -> list[AttentionConfig]:
    configs = []
    for i, (dtype, split, sk) in enumerate((d, s, k) for d in DTYPES for s in SPLITS for k in SEQ_LEN_K):
        configs.append(parse_config({
            "dtype": dtype, "g": 1, "seq_len_q": 4, "seq_len_k": sk, "num_heads_q": 4, "num_heads_kv": 2,
            "head_dim_qk": 64, "head_dim_v": 64, "causal": i % 2 == 0, "return_lse": True, "split_kv": split,
            "with_attn_scale": True, "data_seed": 1000 + i,
        }))
    return configs


def _metrics(**bad: Any) -> dict[str, Any]:
    good = {"out_rms": 2e-4, "out_row_err": 1e-5, "out_max_abs": 1e-3, "out_max_rel": 2e-3, "out_err_ratio": 1.1,
            "lse_rms": 1e-7, "lse_max_abs": 2e-6, "lse_row_err": 1e-6, "out_nonfinite": 0, "lse_inf_mismatch": 0,
            "lse_nonfinite": 0}
    return {k: {**good, **bad}.get(k) for k in METRIC_KEYS}


FAILURE_KINDS = ("rms", "rms", "rms", "row", "nan", "error")  # the planted failures, in sampled order
BAD_METRICS = {"row": {"out_row_err": 0.5}, "nan": {"out_nonfinite": 3}}


def result_of(c: AttentionConfig, nth_failure: int, broken: bool = True) -> ConfigResult:
    """The config's result: a pass, or for a planted config of a broken kernel the failure
    FAILURE_KINDS names."""
    common = dict(backend="cpu", device="cpu (numpy emulation)", variant=f"splitkv_{c.dtype}_d64_bn32", block_n=32,
                  source_hash="ab12cd34", timings={"total_s": 0.01})
    threshold, reason = rms_threshold(c)
    kind = FAILURE_KINDS[nth_failure % len(FAILURE_KINDS)] if broken and planted(c) else "pass"
    if not_applicable(c):
        return ConfigResult(c, "not_applicable", not_applicable_reason="grid_too_large", detail="grid too large", **common)
    if kind == "error":
        detail = "launch failed: too many resources requested for launch\nptxas info: 255 registers"
        return ConfigResult(c, "error", detail=detail, reproducer=_reproducer(c, threshold, reason), **common)
    bad = BAD_METRICS.get(kind, {"out_rms": 0.05 + 0.01 * nth_failure} if kind == "rms" else {})
    metrics = _metrics(**bad)
    verdict = evaluate(c, metrics, rms_threshold=threshold, threshold_reason=reason)
    return ConfigResult(c, verdict.outcome, failed_gate=verdict.failed_gate, detail=verdict.detail, metrics=metrics,
                        gates=verdict.gates, reproducer=reproducer_command(c, "cpu", verdict.gates, frozenset()), **common)


def _reproducer(c: AttentionConfig, threshold: float, reason: str) -> str:
    return reproducer_command(c, "cpu", gates_for(c, rms_threshold=threshold, threshold_reason=reason), frozenset())


@dataclass
class Seeded:
    sweep_id: int
    configs: list[AttentionConfig]
    results: dict[str, ConfigResult] = field(default_factory=dict)  # by config hash

    def failures(self) -> list[ConfigResult]:
        return [r for r in self.results.values() if r.outcome not in ("pass", "not_applicable")]


def create(url: str, configs: list[AttentionConfig], label: str) -> int:
    with session_scope(url) as s:
        sweep = repo.create_sweep(s, request={"samples": len(configs), "backend": "cpu", "label": label}, seed=7,
                                  backend="cpu", label=label, splitkv_budget=3 << 29, budget_source="fallback",
                                  device="cpu", draws=len(configs) + sum(FILTERED.values()), filtered=FILTERED,
                                  configs=configs)
        return sweep.id


def record(url: str, sweep_id: int, results: list[ConfigResult]) -> None:
    """As workers.execute does: mark running, write the results, then finish once none is queued.

    The results go in one transaction (a worker commits each) so that seeding stays cheap.
    """
    with session_scope(url) as s:
        repo.mark_running(s, sweep_id)
        for result in results:
            repo.record_result(s, sweep_id, result.config_hash, result.to_row(), worker="cpu@seed")
    with session_scope(url) as s:
        repo.finish_if_complete(s, sweep_id)


def results_for(configs: list[AttentionConfig], broken: bool = True) -> list[ConfigResult]:
    out, nth = [], 0
    for c in configs:
        out.append(result_of(c, nth, broken))
        nth += planted(c)
    return out


def seed_finished(url: str, label: str = "nightly") -> Seeded:
    configs = grid()
    sweep_id = create(url, configs, label)
    results = results_for(configs)
    record(url, sweep_id, results)
    return Seeded(sweep_id, configs, {r.config_hash: r for r in results})


REGIME_FACTS = {"fact_masked_rows": 0, "fact_max_abs_lse": 12.5, "fact_max_abs_logit": 30.0, "fact_top_weight": 0.95,
                "fact_flatness": 40.0}


def regimes_of(configs: list[AttentionConfig]) -> list[AttentionConfig]:
    """The grid with every third config in the `sink` regime, the rest `normal`."""
    return [c.model_copy(update={"data_regime": "sink" if i % 3 == 0 else "normal"}) for i, c in enumerate(configs)]


def seed_regimes(url: str, label: str = "regimes") -> Seeded:
    """The grid of seed_finished over two regimes (regimes_of), its request drawing both, and every
    run's numeric facts REGIME_FACTS (an |LSE| of 10-100, |logits| of 10-100, peaked rows)."""
    configs = regimes_of(grid())
    with session_scope(url) as s:
        sweep = repo.create_sweep(s, request={"samples": len(configs), "backend": "cpu", "label": label,
                                              "data_regimes": {"normal": 0.5, "sink": 0.5}},
                                  seed=7, backend="cpu", label=label, splitkv_budget=3 << 29, budget_source="fallback",
                                  device="cpu", draws=len(configs), filtered={}, configs=configs)
        sweep_id = sweep.id
    results = results_for(configs)
    for r in results:
        if r.outcome not in ("not_applicable", "error"):
            r.metrics.update(REGIME_FACTS)
    record(url, sweep_id, results)
    return Seeded(sweep_id, configs, {r.config_hash: r for r in results})


def seed_ci(url: str, repository: str, shas: list[str], broken_from: int) -> list[int]:
    """Push sweeps of `shas` (oldest first) to main; the kernels break at commit `broken_from`.

    The CI columns are set as submit.ci.start_ci_sweep sets them, without the kernel bundle
    and the broker a real webhook needs.
    """
    from store.models import Sweep

    ids = []
    for i, sha in enumerate(shas):
        configs = grid()
        sweep_id = create(url, configs, f"ci {repository} main {sha[:12]}")
        with session_scope(url) as s:
            sweep = s.get(Sweep, sweep_id)
            sweep.repository, sweep.ref, sweep.commit_sha, sweep.event = repository, "refs/heads/main", sha, "push"
        record(url, sweep_id, results_for(configs, broken=i >= broken_from))
        ids.append(sweep_id)
    return ids
