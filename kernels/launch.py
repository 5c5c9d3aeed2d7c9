"""Launch plans: the grids, blocks, dynamic shared memory and packed arguments of one attention
call's kernels (the split kernel, then the combine unless the split kernel fuses it), and the
ctypes packing every runtime's launch call takes."""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from attnconfig import AttentionConfig
from kernels.defects import COMBINE_DEFECTS
from kernels.errors import NotApplicable
from kernels.select import COMBINE_THREADS, MAX_GRID_X, Variant
from kernels.tuning import FUSED_COMBINE_MAX_SPLITS, FUSED_COMBINE_ONE_LEVEL

DEFAULT_MAX_SHARED = 48 * 1024   # dynamic shared memory a kernel gets without opting in to more
COMBINE_MAX_GROUPS = 16          # split groups of a combine block, at most (many splits)


def physical_strides(outer: tuple[int, int], seq: int, dim: int, trans: bool) -> tuple[int, int, int, int]:
    """Element strides (batch, head, seq, dim) of a contiguous [g, H, seq, dim] / [g, H, dim, seq] buffer."""
    _, heads = outer
    per_head = seq * dim
    if trans:
        return (heads * per_head, per_head, 1, seq)
    return (heads * per_head, per_head, dim, 1)


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a ctypes type and its value (pointers are ints, 0 for null)."""

    ctype: type
    value: Any

    def as_ctypes(self) -> Any:
        return self.ctype(self.value)


def ptr(value: int) -> Arg:
    return Arg(ctypes.c_void_p, int(value) or None)


def i32(value: int) -> Arg:
    return Arg(ctypes.c_int32, int(value))


def i64(value: int) -> Arg:
    return Arg(ctypes.c_int64, int(value))


def f32(value: float) -> Arg:
    return Arg(ctypes.c_float, float(value))


@dataclass(frozen=True)
class Launch:
    kernel: str          # "fwd" or "combine"
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Arg, ...]
    shared_bytes: int = 0   # dynamic shared memory


def kernels_given(launches: Sequence[Launch], address: int) -> list[str]:
    """The kernels (Launch.kernel, in launch order) among `launches` that take `address` as a
    pointer argument: the only ones that can store into that buffer."""
    return [launch.kernel for launch in launches
            if any(a.ctype is ctypes.c_void_p and a.value == address for a in launch.args)]


def pack_kernel_params(args: Sequence[Arg]) -> tuple[Any, list[Any]]:
    """A void*[] of pointers to each argument (cuLaunchKernel's kernelParams) and the keep-alive list."""
    objs = [a.as_ctypes() for a in args]
    arr = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
    return arr, objs


def fwd_launch(config: AttentionConfig, variant: Variant, buf: Mapping[str, int], *,
               quant_scale: float = 1.0, quant_zero_point: int = 0) -> Launch:
    c = config
    g, hq, hkv, sq, sk, dqk, dv = (c.g, c.num_heads_q, c.num_heads_kv, c.seq_len_q, c.seq_len_k,
                                   c.head_dim_qk, c.head_dim_v)
    qs = physical_strides((g, hq), sq, dqk, c.trans_q)
    ks = physical_strides((g, hkv), sk, dqk, c.trans_k)
    vs = physical_strides((g, hkv), sk, dv, c.trans_v)
    os_ = physical_strides((g, hq), sq, dv, c.trans_o)
    scale = 1.0 / float(np.sqrt(dqk)) if c.with_attn_scale else 1.0
    split = c.split_kv > 1
    args = (
        ptr(buf["q"]), ptr(buf["k"]), ptr(buf["v"]), ptr(buf.get("bias", 0)),
        ptr(0 if split else buf["o"]), ptr(0 if split else buf.get("lse", 0)),
        ptr(buf.get("o_part", 0)), ptr(buf.get("lse_part", 0)),
        ptr(buf.get("prefix_offset", 0)), ptr(buf.get("current_seq_len", 0)),
        i32(g), i32(hq), i32(hkv), i32(sq), i32(sk), i32(dqk), i32(dv),
        *map(i64, qs), *map(i64, ks), *map(i64, vs), *map(i64, os_),
        i32(c.split_kv), i32(1 if split else 0), i32(1 if c.causal else 0), f32(scale),
        f32(quant_scale), i32(quant_zero_point),
    )
    if variant.path == "mma":
        fused = bool(buf.get("combine_count"))
        if fused:   # the kernel's last block to finish per row tile writes O and LSE (fuses_combine)
            args = (*args[:4], ptr(buf["o"]), ptr(buf.get("lse", 0)), *args[6:])
        args = (*args, ptr(buf.get("combine_count", 0)), ptr(buf.get("combine_part", 0)),
                i32(fused_combine_group(c.split_kv) if fused else 0))
    grid_x = fwd_blocks_x(c, variant)
    if grid_x > MAX_GRID_X:
        raise NotApplicable("grid_too_large", f"grid x = {grid_x} > {MAX_GRID_X}")
    return Launch("fwd", (grid_x, c.split_kv, 1), (variant.threads, 1, 1), args, variant.shared_bytes)


def fwd_blocks_x(config: AttentionConfig, variant: Variant) -> int:
    """Blocks of one split: one per query row (rowwise), per group of a kv head's rows (the others)."""
    c = config
    if variant.path in ("grouped", "mma"):
        return c.g * c.num_heads_kv * -(-(c.gqa_ratio * c.seq_len_q) // variant.block_m)
    return c.g * c.num_heads_q * c.seq_len_q


def fuses_combine(config: AttentionConfig, variant: Variant, max_splits: int | None = None) -> bool:
    """Whether the split kernel combines the splits itself (the mma decode variant, up to
    max_splits, default FUSED_COMBINE_MAX_SPLITS): one launch, not two. Its last blocks to finish
    combine, in one level or two (fused_combine_group), none waiting on another."""
    limit = FUSED_COMBINE_MAX_SPLITS if max_splits is None else max_splits
    # The combine's defect switches live in the combine kernel: a variant built with one runs it.
    return variant.mma_decode and 1 < config.split_kv <= limit and not COMBINE_DEFECTS & set(variant.defects)


def fused_combine_group(split_kv: int) -> int:
    """Splits per group of the fused combine's first level: all of them up to
    FUSED_COMBINE_ONE_LEVEL (one level), else about their square root, so that the last block of
    a group and the last of the groups' combiners each read about sqrt(splits) partials (one
    block reading 47 splits' partials ran slower than the combine kernel: docs/decisions.md)."""
    if split_kv <= FUSED_COMBINE_ONE_LEVEL:
        return split_kv
    return math.isqrt(split_kv - 1) + 1   # ceil(sqrt(split_kv))


def fused_combine_groups(split_kv: int) -> int:
    """Groups of the fused combine's first level (1: one level)."""
    return -(-split_kv // fused_combine_group(split_kv))


def fused_combine_counters(config: AttentionConfig, variant: Variant) -> int:
    """The fused combine's int32 counters, zeroed: per row tile, one per group and one for the
    groups where there are several (the kernel's attn_fused_combine)."""
    groups = fused_combine_groups(config.split_kv)
    return fwd_blocks_x(config, variant) * (groups + 1 if groups > 1 else 1)


def fused_combine_part_floats(config: AttentionConfig) -> int:
    """f32 elements of the fused combine's group partials (O and LSE of every row per group),
    where it has two levels; 0 with one. Apart from the splits' partials, which the verifier
    reads as the split kernel wrote them, and not in splitkv_extra_bytes (docs/spec.md §6
    budgets the partials): about sqrt(split_kv) / split_kv of them more."""
    c = config
    groups = fused_combine_groups(c.split_kv)
    return groups * c.g * c.num_heads_q * c.seq_len_q * (c.head_dim_v + 1) if groups > 1 else 0


def launch_plan(config: AttentionConfig, variant: Variant, buf: Mapping[str, int], *,
                quant_scale: float = 1.0, quant_zero_point: int = 0) -> list[Launch]:
    """The launches of one attention call: the split kernel, then the combine unless the split
    kernel fuses it (buf holds "combine_count", zeroed int32 per block of a split: fuses_combine)."""
    launches = [fwd_launch(config, variant, buf, quant_scale=quant_scale, quant_zero_point=quant_zero_point)]
    if config.split_kv > 1 and not buf.get("combine_count"):
        launches.append(combine_launch(config, variant, buf))
    return launches


def combine_launch(config: AttentionConfig, variant: Variant, buf: Mapping[str, int]) -> Launch:
    c = config
    os_ = physical_strides((c.g, c.num_heads_q), c.seq_len_q, c.head_dim_v, c.trans_o)
    args = (
        ptr(buf["o_part"]), ptr(buf["lse_part"]), ptr(buf["o"]), ptr(buf.get("lse", 0)),
        i32(c.g), i32(c.num_heads_q), i32(c.seq_len_q), i32(c.head_dim_v),
        *map(i64, os_), i32(c.split_kv),
    )
    dims = combine_dims(c.split_kv, c.head_dim_v)
    dim_blocks = -(-c.head_dim_v // dims)
    return Launch("combine", (c.g * c.num_heads_q * c.seq_len_q, dim_blocks, 1), (COMBINE_THREADS, 1, 1),
                  (*args, i32(dims)))


def combine_dims(splits: int, dv: int) -> int:
    """Value dims per combine block: its threads form COMBINE_THREADS / dims groups, each summing
    every group-th split of those dims. As many groups as splits (a power of two, at most
    COMBINE_MAX_GROUPS), and no more dims than the row has (rounded up to a power of two): a
    row with 3 splits is one block of all its dims, a decode row with 256 splits 16 groups of 16."""
    groups = 1
    while groups * 2 <= min(splits, COMBINE_MAX_GROUPS):
        groups *= 2
    dims = COMBINE_THREADS // groups
    while dims // 2 >= dv and dims > 1:
        dims //= 2
    return dims
