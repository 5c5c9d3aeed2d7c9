"""Sweep coverage (docs/spec.md §6 "Coverage"): which corners of the config space a sweep reached.

A **cell** is (path, regime, feature, value): the kernel path family that ran the config
(`mma`, `grouped`, `rowwise`: the variant's path), its data regime, and one feature with one
of its values (FEATURES). A config falls in one cell per feature. Features are taken one at a
time, crossed with path and regime only, so the space stays a few hundred cells: every value of
every feature is reached on every path in every regime, not every combination of values.

Config features come from the config (and the block_n it ran at, for empty splits); fact
features from the numeric facts a run records (`fact_*` metrics, reference/facts.py) and are
left out for a config without them (not run, not applicable).

The **cell space** is paths x REGIMES x (feature, value) less the cells no config can reach
(`possible`): the mma path runs f16/bf16 only, untransposed Q, K, V, head dims <= 256; the
grouped path no i8 and head dims <= 256; no sampled config masks a whole row (key 0 is visible
to every row, docs/spec.md §2); `uniform` never gives |LSE| or |logits| >= 100 (a peaked row it
gives with one visible key); `large_logits` never an |LSE| below 10. Each cell of the space is **covered** (at least
`rare` configs), **rare** (1 to rare - 1) or **never** (0); a config in a cell outside the space
is reported under `outside` (a sign that `possible` is out of date).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from attnconfig import DTYPES, AttentionConfig, parse_config
from attnconfig.regimes import REGIMES
from reference.splits import blocks_per_split, n_blocks

PATHS = ("mma", "grouped", "rowwise")
FEATURES: dict[str, tuple[str, ...]] = {
    "mask": ("none", "causal", "causal_prefix"),
    "kv_cache": ("no", "yes"),
    "gqa_ratio": ("1", "2-4", "8+"),
    "splits": ("1", "2-8", "16+"),
    "empty_splits": ("no", "yes"),
    "head_dim": ("<=64", "<=128", "<=256", ">256"),
    "dtype": DTYPES,
    "layout": ("rows", "transposed"),
    # numeric facts (reference/facts.py)
    "lse": ("<10", "10-100", ">=100"),
    "logits": ("<10", "10-100", ">=100"),
    "peak": ("flat", "spread", "peaked"),
    "masked_rows": ("no", "yes"),
}
FACT_FEATURES = ("lse", "logits", "peak", "masked_rows")
DEFAULT_BLOCK_N = 32
RARE = 3

Cell = tuple[str, str, str, str]  # (path, regime, feature, value)


def _bucket(x: float, edges: tuple[float, float], names: tuple[str, str, str]) -> str:
    return names[0] if x < edges[0] else names[1] if x < edges[1] else names[2]


def path_of(variant: str | None) -> str | None:
    """The path family of a kernel variant's name (Variant.name: attn_..._mma, attn_..._grouped)."""
    if not variant or not variant.startswith("attn_"):
        return None  # the cpu emulation's names say nothing of a path
    parts = variant.split("_defect")[0].split("_")
    return "mma" if "mma" in parts else "grouped" if "grouped" in parts else "rowwise"


def predicted_path(c: AttentionConfig, mma: bool) -> str:
    """The path the kernels would pick for c (on a device with tensor cores when `mma`)."""
    from kernels.select import select_variant  # kernels is below sweeps; loaded only here

    try:
        return select_variant(c, mma=mma).path
    except Exception:  # not applicable on any path: counted on the fallback path
        return "rowwise"


def config_features(c: AttentionConfig, block_n: int | None = None) -> dict[str, str]:
    """The config features of c (FEATURES without the facts)."""
    bn = block_n or DEFAULT_BLOCK_N
    last = [c.last_valid_key(b) for b in range(c.g)]
    empty = False
    if c.split_kv > 1:
        for L in last:
            nb = n_blocks(L, bn)
            if (c.split_kv - 1) * blocks_per_split(nb, c.split_kv) >= nb:
                empty = True
                break
    ratio = c.gqa_ratio
    dim = max(c.head_dim_qk, c.head_dim_v)
    return {
        "mask": "none" if not c.causal else "causal_prefix" if c.prefix_offset is not None else "causal",
        "kv_cache": "yes" if c.current_seq_len is not None else "no",
        "gqa_ratio": "1" if ratio == 1 else "2-4" if ratio <= 4 else "8+",
        "splits": "1" if c.split_kv == 1 else "2-8" if c.split_kv <= 8 else "16+",
        "empty_splits": "yes" if empty else "no",
        "head_dim": "<=64" if dim <= 64 else "<=128" if dim <= 128 else "<=256" if dim <= 256 else ">256",
        "dtype": c.dtype,
        "layout": "transposed" if (c.trans_q or c.trans_k or c.trans_v) else "rows",
    }


def fact_features(metrics: Mapping[str, Any] | None) -> dict[str, str]:
    """The fact features of a run's metrics; {} when it recorded no facts."""
    if not metrics or metrics.get("fact_max_abs_lse") is None:
        return {}
    top, flat = float(metrics["fact_top_weight"]), float(metrics["fact_flatness"])
    return {
        "lse": _bucket(float(metrics["fact_max_abs_lse"]), (10, 100), FEATURES["lse"]),
        "logits": _bucket(float(metrics["fact_max_abs_logit"]), (10, 100), FEATURES["logits"]),
        "peak": "peaked" if top >= 0.9 else "flat" if flat <= 2.0 else "spread",
        "masked_rows": "yes" if int(metrics["fact_masked_rows"]) > 0 else "no",
    }


def cells_of(c: AttentionConfig, path: str, metrics: Mapping[str, Any] | None = None,
             block_n: int | None = None) -> list[Cell]:
    feats = {**config_features(c, block_n), **fact_features(metrics)}
    return [(path, c.data_regime, f, v) for f, v in feats.items()]


def possible(cell: Cell) -> bool:
    """Whether some config can land in the cell (the rules of the module docstring)."""
    path, regime, feature, value = cell
    if path == "mma" and ((feature == "dtype" and value not in ("f16", "bf16"))
                          or (feature == "layout" and value == "transposed")
                          or (feature == "head_dim" and value == ">256")):
        return False
    if path == "grouped" and ((feature == "dtype" and value == "i8") or (feature == "head_dim" and value == ">256")):
        return False
    if feature == "masked_rows" and value == "yes":
        return False
    if regime == "uniform" and feature in ("lse", "logits") and value == ">=100":
        return False
    if regime == "large_logits" and feature == "lse" and value == "<10":
        return False
    return True


def cell_space(paths: Iterable[str] = PATHS, regimes: Iterable[str] = REGIMES) -> list[Cell]:
    return [(p, r, f, v) for p in paths for r in regimes for f, vals in FEATURES.items() for v in vals
            if possible((p, r, f, v))]


class CellCounts:
    """Configs (and failing ones) per cell; add more sweeps' counts with `merge`."""

    def __init__(self) -> None:
        self.configs: Counter[Cell] = Counter()
        self.failing: Counter[Cell] = Counter()

    def add(self, cells: Iterable[Cell], failing: bool = False) -> None:
        for cell in cells:
            self.configs[cell] += 1
            if failing:
                self.failing[cell] += 1

    def merge(self, other: "CellCounts") -> "CellCounts":
        self.configs.update(other.configs)
        self.failing.update(other.failing)
        return self


def _item(item: Any) -> tuple[AttentionConfig, str | None, Mapping[str, Any] | None, str | None, int | None]:
    """(config, outcome, metrics, variant, block_n) of a result: a ConfigResult-like object, a
    mapping with those keys, or a tuple (config, outcome, metrics, variant[, block_n])."""
    if isinstance(item, tuple):
        config, outcome, metrics, variant, *rest = item
        block_n = rest[0] if rest else None
    elif isinstance(item, Mapping):
        config, outcome, metrics = item["config"], item.get("outcome"), item.get("metrics")
        variant, block_n = item.get("variant"), item.get("block_n")
    else:
        config, outcome, metrics = item.config, item.outcome, item.metrics
        variant, block_n = item.variant, item.block_n
    return parse_config(config), outcome, metrics, variant, block_n


def count_cells(results: Iterable[Any], mma: bool = False) -> CellCounts:
    """Cell counts of a sweep's results (see _item); a result without a variant is counted on
    the path its config would take (predicted_path)."""
    from attnconfig.outcomes import FAILING_OUTCOMES

    counts = CellCounts()
    for item in results:
        c, outcome, metrics, variant, block_n = _item(item)
        path = path_of(variant) or predicted_path(c, mma)
        counts.add(cells_of(c, path, metrics, block_n), failing=outcome in FAILING_OUTCOMES)
    return counts


def coverage_report(results: Iterable[Any], *, paths: Iterable[str] = PATHS, regimes: Iterable[str] = REGIMES,
                    rare: int = RARE, prior: CellCounts | None = None, mma: bool = False) -> dict[str, Any]:
    """A JSON-able report: totals of covered / rare / never cells over the cell space, the same
    per regime and per path, the rare and never cells, cells outside the space, and every cell
    of the space with its configs and failing configs (prior: counts of earlier sweeps added)."""
    counts = count_cells(results, mma=mma)
    if prior is not None:
        counts.merge(prior)
    space = cell_space(paths, regimes)
    in_space = set(space)

    def state(n: int) -> str:
        return "never" if n == 0 else "rare" if n < rare else "covered"

    totals: Counter[str] = Counter()
    by_regime: dict[str, Counter[str]] = {}
    by_path: dict[str, Counter[str]] = {}
    cells, never, rare_cells = [], [], []
    for cell in space:
        n = counts.configs[cell]
        s = state(n)
        totals[s] += 1
        by_regime.setdefault(cell[1], Counter())[s] += 1
        by_path.setdefault(cell[0], Counter())[s] += 1
        entry = {"path": cell[0], "regime": cell[1], "feature": cell[2], "value": cell[3],
                 "configs": n, "failing": counts.failing[cell], "state": s}
        cells.append(entry)
        (never if s == "never" else rare_cells if s == "rare" else []).append(entry)
    outside = [{"path": c[0], "regime": c[1], "feature": c[2], "value": c[3], "configs": n}
               for c, n in sorted(counts.configs.items()) if c not in in_space]
    zero = {"covered": 0, "rare": 0, "never": 0}
    return {
        "cell": "(path, regime, feature, value)",
        "rare_below": rare,
        "cells_total": len(space),
        "totals": {**zero, **totals},
        "by_regime": {r: {**zero, **v} for r, v in by_regime.items()},
        "by_path": {p: {**zero, **v} for p, v in by_path.items()},
        "never": never,
        "rare": rare_cells,
        "outside": outside,
        "cells": cells,
    }


def coverage_summary(report: Mapping[str, Any], limit: int = 12) -> str:
    """A few lines for the CLI: totals, per regime, and the first never-reached cells."""
    t = report["totals"]
    lines = [f"coverage: {t['covered']} covered, {t['rare']} rare (< {report['rare_below']} configs), "
             f"{t['never']} never of {report['cells_total']} cells {report['cell']}"]
    for regime, v in report["by_regime"].items():
        lines.append(f"  {regime:<13} covered {v['covered']:>4}  rare {v['rare']:>4}  never {v['never']:>4}")
    if report["never"]:
        shown = ", ".join(f"{c['path']}/{c['regime']}/{c['feature']}={c['value']}" for c in report["never"][:limit])
        more = len(report["never"]) - limit
        lines.append(f"  never: {shown}" + (f" and {more} more" if more > 0 else ""))
    if report["outside"]:
        lines.append(f"  outside the cell space: {len(report['outside'])} cells (sweeps.coverage.possible is out of date)")
    return "\n".join(lines)
