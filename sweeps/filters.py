"""The prefilters of docs/spec.md §6: a drawn config is rejected by the first filter that fails.

Order and reason names (stored in `filtered {reason: count}`; never rename them):
1. `max_tokens`          max(seq_len_q, seq_len_k) * g > max_tokens
2. `splitkv_extra_bytes` split-KV partial buffers (attnconfig.footprint) > the budget
3. `reference_flops`     reference_flops(c) > reference_flops_limit
4. `reference_bytes`     reference_bytes(c) > reference_bytes_limit
and `duplicate`, counted by the sampler for a config whose content hash was already accepted.
A bound is inclusive: a config exactly at a limit passes.
"""
from __future__ import annotations

from dataclasses import dataclass

from attnconfig.config import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes

GIB = 1 << 30
SPLITKV_BUDGET_MIN = 1 * GIB
SPLITKV_BUDGET_MAX = 8 * GIB
SPLITKV_BUDGET_NO_DEVICE = 3 * GIB // 2  # 1.5 GiB: no GPU could be queried (cpu backend too)

FILTER_REASONS = ("max_tokens", "splitkv_extra_bytes", "reference_flops", "reference_bytes")
DUPLICATE = "duplicate"
ALL_REASONS = FILTER_REASONS + (DUPLICATE,)

F64 = 8  # the reference computes in float64


def splitkv_budget(total_memory: int | None, override: int | None) -> int:
    """Bytes the split-KV partial buffers may take (docs/spec.md §6, filter 2).

    `override` (the sweep's splitkv_extra_bytes_limit) wins when given; otherwise the device's
    total memory // 8 clamped to [1 GiB, 8 GiB]; 1.5 GiB when no device could be queried
    (`total_memory` None).
    """
    if override is not None:
        if override < 0:
            raise ValueError(f"splitkv_extra_bytes_limit={override} must be >= 0")
        return int(override)
    if total_memory is None:
        return SPLITKV_BUDGET_NO_DEVICE
    return int(min(max(total_memory // 8, SPLITKV_BUDGET_MIN), SPLITKV_BUDGET_MAX))


def max_tokens_of(c: AttentionConfig) -> int:
    """The quantity the max_tokens filter bounds: max(seq_len_q, seq_len_k) * g."""
    return max(c.seq_len_q, c.seq_len_k) * c.g


def reference_flops(c: AttentionConfig) -> int:
    """Estimated reference cost: g * Hq * Sq * Sk * (2 * (Dqk + Dv) + 8)."""
    return c.g * c.num_heads_q * c.seq_len_q * c.seq_len_k * (2 * (c.head_dim_qk + c.head_dim_v) + 8)


# Host seconds of one drawn input element (a float64 normal and its cast, about 10 ns) in
# reference flops (numpy's matmuls and exponentials run at a few Gflop/s per core).
INPUT_ELEMENT_FLOPS = 50


def host_cost(c: AttentionConfig) -> int:
    """A config's host time in flop units, for ordering work: the reference's flops plus the
    input elements it draws (reference_bytes counts them, with the output, in f64)."""
    return reference_flops(c) + INPUT_ELEMENT_FLOPS * (reference_bytes(c) // F64)


def reference_bytes(c: AttentionConfig) -> int:
    """The reference's working set: its f64 output plus q, k, v and bias held in f64.

    8 * (g*Hq*Sq*Dv  [output]  + g*Hq*Sq*Dqk [q] + g*Hkv*Sk*Dqk [k] + g*Hkv*Sk*Dv [v]
         + g*Hq*Sq*Sk [bias, only with_attn_bias]).
    """
    g, hq, hkv = c.g, c.num_heads_q, c.num_heads_kv
    sq, sk, dqk, dv = c.seq_len_q, c.seq_len_k, c.head_dim_qk, c.head_dim_v
    elems = g * hq * sq * dv + g * hq * sq * dqk + g * hkv * sk * dqk + g * hkv * sk * dv
    if c.with_attn_bias:
        elems += g * hq * sq * sk
    return F64 * elems


@dataclass(frozen=True)
class Prefilter:
    """The four filters with their limits; `reason(c)` is the first rejecting reason or None."""

    max_tokens: int
    splitkv_budget: int
    reference_flops_limit: float
    reference_bytes_limit: int

    @classmethod
    def from_spec(cls, spec, splitkv_budget: int) -> "Prefilter":
        """Limits from a SweepSpec and the split-KV budget already resolved for the device."""
        return cls(
            max_tokens=spec.max_tokens,
            splitkv_budget=splitkv_budget,
            reference_flops_limit=spec.reference_flops_limit,
            reference_bytes_limit=spec.reference_bytes_limit,
        )

    def reason(self, c: AttentionConfig) -> str | None:
        if max_tokens_of(c) > self.max_tokens:
            return "max_tokens"
        if splitkv_extra_bytes(c) > self.splitkv_budget:
            return "splitkv_extra_bytes"
        if reference_flops(c) > self.reference_flops_limit:
            return "reference_flops"
        if reference_bytes(c) > self.reference_bytes_limit:
            return "reference_bytes"
        return None

    def explain(self, c: AttentionConfig) -> str | None:
        """Like `reason`, with the quantity and the limit, e.g. for a rejected single config."""
        r = self.reason(c)
        if r is None:
            return None
        value, limit = {
            "max_tokens": (max_tokens_of(c), self.max_tokens),
            "splitkv_extra_bytes": (splitkv_extra_bytes(c), self.splitkv_budget),
            "reference_flops": (reference_flops(c), self.reference_flops_limit),
            "reference_bytes": (reference_bytes(c), self.reference_bytes_limit),
        }[r]
        return f"{r}: {value} > {limit:g}" if isinstance(limit, float) else f"{r}: {value} > {limit}"
