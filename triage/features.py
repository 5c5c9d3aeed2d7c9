"""The facts about a config that explain failures: its fields and what the split arithmetic makes of them.

A kernel bug is triggered by a condition on the config, but seldom by a field alone: the
split-KV defects of kernels/defects.py show when a split holds no key block, when the blocks do
not divide evenly among the splits, or when a row cannot see any key of a split (docs/spec.md
§3). Those derived facts are computed here with the kernels' own arithmetic
(reference/splits.py: n_blocks, blocks_per_split), per batch entry and per query row, for the
block size the sweep's results record (`block_n`).

`predicates(rows)` returns the atoms the explanation search (triage/explain.py) combines: every
boolean fact and its negation, every dtype, every data regime the sweep drew, and thresholds (`x>=t`, `x<=t`) on the numeric
facts at powers of two and at the ends of what was observed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from attnconfig import DTYPES, AttentionConfig
from attnconfig.regimes import REGIMES
from reference.masks import last_valid_keys, prefix_offsets
from reference.regimes import regime_plan
from reference.splits import blocks_per_split, n_blocks

DEFAULT_BLOCK_N = 32  # the cpu emulation's tile; device rows record their variant's own

# Boolean facts, by the name an explanation shows, with what each means.
BOOLEAN_FACTS = {
    "causal": "causal mask",
    "with_attn_bias": "additive bias",
    "with_attn_scale": "softmax scale applied",
    "return_lse": "LSE returned",
    "trans_q": "Q transposed", "trans_k": "K transposed", "trans_v": "V transposed", "trans_o": "O transposed",
    "prefix_offset": "prefix offsets set",
    "current_seq_len": "per-entry key lengths (KV cache) set",
    "gqa": "grouped-query heads (num_heads_q > num_heads_kv)",
    "split_kv>1": "more than one split",
    "split_kv>blocks": "a batch entry has fewer key blocks than splits (splits without a block)",
    "blocks%split_kv!=0": "a batch entry's key blocks do not divide evenly among the splits",
    "empty_split": "a query row has a split without a key it may see",
    "masked_split": "a query row has a split holding key blocks none of which it may see (a fully masked split)",
}
# Facts of the inputs rather than the shape: they decide whether a bug shows, seldom whether it
# is there (a sink's weight hides a masking bug), so a condition on them must earn its place
# (triage/explain.py DATA_COST).
DATA_FACTS = ("logit_scale", "data_regime")
NUMERIC_FACTS = ("g", "seq_len_q", "seq_len_k", "num_heads_q", "num_heads_kv", "gqa_ratio", "head_dim_qk",
                 "head_dim_v", "split_kv", "blocks", "logit_scale")


def facts(c: AttentionConfig, block_n: int | None = None) -> dict[str, Any]:
    """Every fact of one config: booleans by BOOLEAN_FACTS' names, numbers, and `dtype`."""
    bn = block_n or DEFAULT_BLOCK_N
    S = c.split_kv
    last = last_valid_keys(c)                                   # [g] inclusive last key
    nb = n_blocks(last, bn)                                     # [g] key blocks per entry
    bps = blocks_per_split(nb, S)
    used = np.minimum(S, -(-nb // bps))                         # splits holding a block, per entry
    rows = np.arange(c.seq_len_q, dtype=np.int64)
    if c.causal:
        row_last = np.maximum(0, np.minimum(rows[None, :] + prefix_offsets(c)[:, None], last[:, None]))
    else:
        row_last = np.broadcast_to(last[:, None], (c.g, c.seq_len_q))
    seen = np.minimum(S, -(-(row_last + 1) // (bps * bn)[:, None]))  # splits with a key each row may see
    f: dict[str, Any] = {name: bool(getattr(c, name)) for name in
                         ("causal", "with_attn_bias", "with_attn_scale", "return_lse", "trans_q", "trans_k", "trans_v", "trans_o")}
    f.update({
        "prefix_offset": c.prefix_offset is not None,
        "current_seq_len": c.current_seq_len is not None,
        "gqa": c.gqa_ratio > 1,
        "split_kv>1": S > 1,
        "split_kv>blocks": bool((nb < S).any()),
        "blocks%split_kv!=0": bool((nb % S != 0).any()),
        "empty_split": bool((seen < S).any()),
        "masked_split": bool((seen < used[:, None]).any()),
        # The largest |logit| the inputs may give (reference/regimes.py): an exp a kernel does not
        # shift by a maximum leaves float32's range past 88, whatever the shape.
        "logit_scale": int(round(regime_plan(c).logit_scale)),
        "dtype": c.dtype,
        "data_regime": c.data_regime,
        "blocks": int(nb.min()),
    })
    f.update({name: int(getattr(c, name)) for name in NUMERIC_FACTS if name not in ("blocks", "logit_scale")})
    return f


@dataclass(frozen=True)
class Predicate:
    name: str                         # as an explanation shows it: causal=true, split_kv>=16, dtype=bf16
    test: Callable[[dict[str, Any]], bool]
    kind: str                         # "derived", "field", "threshold", "data": ties prefer them in this order


def _powers(lo: int, hi: int) -> list[int]:
    out, p = [], 1
    while p <= hi:
        if p >= lo:
            out.append(p)
        p <<= 1
    return out


def predicates(all_facts: Sequence[dict[str, Any]], member_facts: Sequence[dict[str, Any]]) -> list[Predicate]:
    """The atoms for one cluster: booleans and negations, dtypes, thresholds at powers of two and
    at the members' extremes (so `x>=t` can name exactly where the failures start)."""
    preds: list[Predicate] = []
    derived = {"gqa", "split_kv>1", "split_kv>blocks", "blocks%split_kv!=0", "empty_split", "masked_split"}
    for name in BOOLEAN_FACTS:
        kind = "derived" if name in derived else "field"
        if name in derived:
            preds.append(Predicate(name, lambda f, n=name: f[n], kind))
            preds.append(Predicate("not " + name, lambda f, n=name: not f[n], kind))
        else:
            preds.append(Predicate(f"{name}=true", lambda f, n=name: f[n], kind))
            preds.append(Predicate(f"{name}=false", lambda f, n=name: not f[n], kind))
    for dt in DTYPES:
        preds.append(Predicate(f"dtype={dt}", lambda f, d=dt: f["dtype"] == d, "field"))
    for regime in REGIMES:
        if any(f["data_regime"] == regime for f in all_facts):
            preds.append(Predicate(f"data_regime={regime}", lambda f, r=regime: f["data_regime"] == r, "data"))
    for name in NUMERIC_FACTS:
        values = [f[name] for f in all_facts]
        lo, hi = min(values), max(values)
        if lo == hi:
            continue
        members = [f[name] for f in member_facts]
        above = set(_powers(lo + 1, hi)) | {min(members)}
        below = set(_powers(lo, hi - 1)) | {max(members)}
        kind = "data" if name in DATA_FACTS else "threshold"
        preds += [Predicate(f"{name}>={t}", lambda f, n=name, t=t: f[n] >= t, kind) for t in sorted(above) if t > lo]
        preds += [Predicate(f"{name}<={t}", lambda f, n=name, t=t: f[n] <= t, kind) for t in sorted(below) if t < hi]
    return preds


def condition_holds(name: str, f: dict[str, Any]) -> bool:
    """Evaluate one predicate by the name `predicates` gave it, on a config's facts."""
    if name.startswith("not "):
        return not condition_holds(name[4:], f)
    for op in (">=", "<="):
        if op in name:
            field, value = name.split(op, 1)
            return f[field] >= int(value) if op == ">=" else f[field] <= int(value)
    if name.startswith("dtype="):
        return f["dtype"] == name[6:]
    if name.startswith("data_regime="):
        return f["data_regime"] == name[len("data_regime="):]
    if name.endswith("=true") or name.endswith("=false"):
        field, value = name.rsplit("=", 1)
        return bool(f[field]) == (value == "true")
    return bool(f[name])
