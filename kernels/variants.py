"""Kernel variants, launch plans and the runtime-neutral part of the GPU backends.

A *variant* is one compilation of kernels/src/attention.hip: every compile-time parameter is in
its deterministic name (dtype, head-dim buckets, block_n, block_m, threads, path, the mma
path's tile, defects), so two configs that need the same binary share it and the compile
cache can key on the name.

Head dims are bucketed: a head dim d in 1..256 runs in the smallest bucket of
HEAD_DIM_BUCKETS that holds it (compile-time loop bounds, masked against the runtime d); a
head dim above 256 runs on the general path (bucket 0, written `any`: runtime loop bounds, any
size up to 1024). So every config of the space has a variant and `NotApplicable` is reserved
for launch limits no sampled config reaches.

`DeviceBackend` holds everything the CUDA and HIP backends share — variant choice, the compile
cache, the buffers, NaN prefill, argument packing, launch plan, timing and copy-out — and
leaves only the runtime calls (compile, load, malloc, memcpy, memset, launch, events) to
kernels/cuda.py and kernels/hip.py.
"""
from __future__ import annotations

import abc
import ctypes
import math
import os
import time
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from attnconfig import AttentionConfig
from attnconfig.footprint import splitkv_extra_bytes
from kernels.backend import (
    DEFECTS,
    Backend,
    DeviceFault,
    DeviceOutOfMemory,
    LaunchError,
    NotApplicable,
    Prepared,
    RunOutput,
)
from kernels.guards import CANARY, GUARD_BYTES, check_guards, fill_value_bits, padded_bytes
from kernels.source import KernelSource

SRC_DIR = Path(__file__).resolve().parent / "src"
SOURCE_FILE = "attention.hip"
HEADER_FILES = ("hip_compat.h",)

# Defect switches compiled into the combine kernel (attn_splitkv_combine) alone.
COMBINE_DEFECTS = frozenset({"oob_store", "oob_store_small", "missing_barrier", "hang"})

HEAD_DIM_BUCKETS = (32, 64, 128, 256)   # compile-time buckets; above the last: general path
GENERAL_BUCKET = 0
DEFAULT_BLOCK_N = 32                    # keys per KV block (SPEC §3 block_n)
DEFAULT_BLOCK_M = 1                     # query rows per thread block (rowwise path)
DEFAULT_THREADS = 128                   # threads per block (must be a multiple of block_n)
COMBINE_THREADS = 256                   # threads per block of the combine kernel
COMBINE_MAX_GROUPS = 16                 # split groups of a combine block, at most (many splits)
MAX_SPLITS = 1024                       # the combine's shared weights (ATTN_MAX_SPLITS)
GROUPED_DTYPES = ("f16", "bf16", "f32")
GROUPED_MAX_ROWS = 4                    # query rows sharing one K/V pass (more: out of registers)
MMA_DTYPES = ("f16", "bf16")            # the tensor-core path (NVIDIA sm_80+, attn_splitkv_fwd_mma)
# The mma path reads Q's fragments from shared memory, not registers, from this DQK bucket on
# (ATTN_MMA_Q_SMEM_FROM; 512: never): D = 256 spilled with them in registers (docs/decisions.md).
# The environment variable is for measuring other thresholds.
MMA_Q_SMEM_FROM = int(os.environ.get("ATTNSWEEP_MMA_Q_SMEM_FROM", "256"))


def _env_choice(var: str, default: int | None, allowed: tuple[int, ...]) -> int | None:
    """A kernel setting from the environment, one of `allowed`, else ValueError naming the rule;
    `default` (None: the table below decides) where the variable is unset."""
    value = os.environ.get(var)
    if value is None:
        return default
    if value not in map(str, allowed):
        rule = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise ValueError(f"{var}={value}: must be {rule}")
    return int(value)


# Prefill's key tile and softmax exponentials by the head dims' buckets summed (qk + v), from
# bench/tune_mma.py --prefill on an H100 at 4096², h32 (docs/decisions.md, "Prefill tiles and
# exponentials by head dim"):
#   <= 64:  64 keys (32: 455 against 472 us with 128)
#   <= 128: 128 keys and ATTN_MMA_EXP2, FlashAttention 2's one FFMA and one ex2 a score
#           (555 against 699 us with the old 64 keys and expf; causal 342 against 405)
#   <= 256: 128 keys, expf (980 against 1030 us; with EXP2 too 1090: it slows this one)
#   past:   32 keys (shared memory)
MMA_PREFILL_TABLE = ((64, 64, 0), (128, 128, 1), (256, 128, 0))


def _prefill_tiles(dims: int) -> tuple[int, bool]:
    """MMA_PREFILL_TABLE's (keys a tile, ATTN_MMA_EXP2) for head-dim buckets summing to `dims`."""
    return next(((t, bool(exp2)) for limit, t, exp2 in MMA_PREFILL_TABLE if dims <= limit), (32, False))


# ATTNSWEEP_MMA_EXP2 (0 or 1) and ATTNSWEEP_MMA_PREFILL_TILE_N (32, 64 or 128) override the table
# for every mma variant (EXP2 decode included) and every prefill one up to 256 summed, to measure.
MMA_EXP2 = _env_choice("ATTNSWEEP_MMA_EXP2", None, (0, 1))
MMA_DECODE_ROWS = 16                    # rows per kv head up to which the mma path splits tiles by keys
MMA_PREFILL_TILE_N = _env_choice("ATTNSWEEP_MMA_PREFILL_TILE_N", None, (32, 64, 128))
# Prefill's 16-row tiles per warp (attention.hip MT): 2 reads each K and V fragment once for two
# products, as FlashAttention 2's 128-row blocks of four warps do: fewer shared-memory bytes per
# mma (P.V 128 against 256; Q.K^T 192 against 256, Q's fragments now read too), where head dims
# sum to 256 or less. Measured slower on an H100 (1069 against 1014 µs at 4096², D = 128; its
# spills cost more than the shared-memory reads save, docs/decisions.md): 1 stays the default.
MMA_PREFILL_ROW_TILES = _env_choice("ATTNSWEEP_MMA_PREFILL_ROW_TILES", 1, (1, 2))
PATHS = ("rowwise", "grouped", "mma")
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535

# C++ spellings of the kernels' template arguments (HIP names; hip_compat.h maps them on CUDA).
QK_CPP = {"f16": "__half", "bf16": "__hip_bfloat16", "f32": "float", "i8": "signed char"}
OUT_CPP = {"f16": "__half", "bf16": "__hip_bfloat16", "f32": "float", "i8": "__half"}
LSE_CPP = {"f16": "float", "bf16": "float", "f32": "float", "i8": "__half"}


def defect_macro(name: str) -> str:
    """no_neginf_guard -> ATTN_DEFECT_NO_NEGINF_GUARD (the macro attention.hip tests)."""
    if name not in DEFECTS:
        raise ValueError(f"defects: unknown defect {name!r}; known: {sorted(DEFECTS)}")
    return "ATTN_DEFECT_" + name.upper()


def head_dim_bucket(d: int) -> int:
    """Smallest compile-time bucket >= d, or GENERAL_BUCKET (0) above the largest."""
    if not 1 <= d <= 1024:
        raise ValueError(f"head dim {d} outside [1, 1024]")
    for b in HEAD_DIM_BUCKETS:
        if d <= b:
            return b
    return GENERAL_BUCKET


def _bucket_label(b: int) -> str:
    return "any" if b == GENERAL_BUCKET else str(b)


@dataclass(frozen=True)
class Variant:
    """Every compile-time parameter of one binary. The module holds the split kernel and the combine."""

    dtype: str
    dqk_bucket: int
    dv_bucket: int
    block_n: int = DEFAULT_BLOCK_N
    block_m: int = DEFAULT_BLOCK_M
    threads: int = DEFAULT_THREADS
    defects: tuple[str, ...] = ()
    path: str = "rowwise"
    tile_n: int = 0          # mma path: keys per shared-memory tile (the others step by `threads`)
    min_blocks: int = 0      # mma path: blocks per SM its register budget must allow (__launch_bounds__)
    row_tiles: int = 1       # mma path: 16-row tiles per warp (MT; more than one for prefill only)

    def __post_init__(self) -> None:
        if self.dtype not in QK_CPP:
            raise ValueError(f"dtype: unknown {self.dtype!r}")
        if self.threads % self.block_n:
            raise ValueError(f"threads={self.threads} is not a multiple of block_n={self.block_n}")
        if self.path not in PATHS:
            raise ValueError(f"path: unknown {self.path!r}; choose one of {PATHS}")
        if self.path == "rowwise" and self.block_m != 1:
            raise ValueError("block_m: the rowwise path runs 1 query row per thread block")
        fast_dtypes = {"grouped": GROUPED_DTYPES, "mma": MMA_DTYPES}.get(self.path)
        if fast_dtypes is not None:
            if self.dtype not in fast_dtypes:
                raise ValueError(f"path: the {self.path} path runs {fast_dtypes}, not {self.dtype}")
            if GENERAL_BUCKET in (self.dqk_bucket, self.dv_bucket):
                raise ValueError(f"path: the {self.path} path needs head dims <= 256")
        if self.path == "grouped" and self.block_m not in (1, 2, 4, 8):
            raise ValueError("block_m: the grouped path groups 1, 2, 4 or 8 query rows")
        if self.path == "mma":
            if self.block_m % 16 or self.threads % 32 or self.tile_n % 16 or self.tile_n <= 0:
                raise ValueError("mma path: block_m and tile_n must be multiples of 16, threads of 32")
            if self.row_tiles not in (1, 2) or self.block_m % (16 * self.row_tiles):
                raise ValueError(f"mma path: row_tiles={self.row_tiles} must be 1 or 2 and divide block_m / 16")
            if self.row_tiles > 1 and self.key_groups != 1:
                raise ValueError("mma path: several row tiles a warp only without key groups (prefill)")
            if self.tile_n % (self.key_groups * 16):
                raise ValueError(f"mma path: tile_n={self.tile_n} gives a warp fewer than 16 keys")
            if not 1 <= self.min_blocks <= 8:
                raise ValueError("mma path: min_blocks must be in 1..8")
            if self.shared_bytes > MMA_MAX_SHARED:
                raise ValueError(f"mma path: {self.shared_bytes} B of shared memory per block > {MMA_MAX_SHARED} "
                                 "(the smallest opt-in limit of the devices with mma.sync)")
        elif self.tile_n or self.min_blocks or self.row_tiles != 1:
            raise ValueError("tile_n, min_blocks, row_tiles: only the mma path has shared-memory tiles")
        if tuple(sorted(set(self.defects))) != self.defects:
            raise ValueError("defects: must be sorted and unique")
        for d in self.defects:
            defect_macro(d)

    @property
    def name(self) -> str:
        base = (f"attn_{self.dtype}_qk{_bucket_label(self.dqk_bucket)}_v{_bucket_label(self.dv_bucket)}"
                f"_n{self.block_n}_m{self.block_m}_t{self.threads}")
        if self.path == "mma":
            base += f"_k{self.tile_n}_b{self.min_blocks}" + (f"_r{self.row_tiles}" if self.row_tiles > 1 else "")
        if self.path != "rowwise":
            base += "_" + self.path
        if self.defects:
            base += "_defect-" + "-".join(self.defects)
        return base

    @property
    def mma_decode(self) -> bool:
        """The mma path's decode shape (mma_shape): one 16-row tile whose keys split over key groups."""
        return self.path == "mma" and self.block_m == MMA_DECODE_ROWS

    @property
    def row_warps(self) -> int:
        """mma path: warps along the rows (WM), each taking row_tiles 16-row tiles."""
        return self.block_m // 16 // self.row_tiles if self.path == "mma" else 1

    @property
    def key_groups(self) -> int:
        """mma path: warps that split each tile's keys (WN); the others are row warps (WM)."""
        return self.threads // 32 // self.row_warps if self.path == "mma" else 1

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of the split kernel (AttnMmaSmem in attention.hip; the kernel
        traps if it gets less): room for one K and one V tile of padded rows (the swizzled rows
        of head dims 64, 128 and 256 use less of it) and, from DQK bucket MMA_Q_SMEM_FROM on or
        with several row tiles a warp, for the block's Q rows; or the key groups' merge if larger."""
        if self.path != "mma":
            return 0
        q_in_smem = self.dqk_bucket >= MMA_Q_SMEM_FROM or self.row_tiles > 1
        q_rows = self.block_m * (self.dqk_bucket + 8) * 2 if q_in_smem else 0
        tiles = self.tile_n * (self.dqk_bucket + 8 + self.dv_bucket + 8) * 2 + q_rows
        merge = (self.key_groups // 2) * self.row_warps * (32 + 16 * (self.dv_bucket + 8)) * 4
        return max(tiles, merge)

    @property
    def blocks_per_sm(self) -> int | None:
        """The blocks one SM runs at once that the variant was built for (the automatic split
        sizes waves by it); None: the path's own default."""
        return self.min_blocks if self.path == "mma" else None

    @property
    def fwd_expr(self) -> str:
        if self.path == "mma":
            return (f"attn_splitkv_fwd_mma<{QK_CPP[self.dtype]}, {self.dqk_bucket}, {self.dv_bucket}, "
                    f"{self.block_n}, {self.tile_n}, {self.row_warps}, {self.key_groups}, "
                    f"{self.min_blocks}" + (f", {self.row_tiles}>" if self.row_tiles > 1 else ">"))
        if self.path == "grouped":
            return (f"attn_splitkv_fwd_grouped<{QK_CPP[self.dtype]}, {self.dqk_bucket}, {self.dv_bucket}, "
                    f"{self.block_n}, {self.threads}, {self.block_m}>")
        return (f"attn_splitkv_fwd<{QK_CPP[self.dtype]}, {self.dqk_bucket}, {self.dv_bucket}, "
                f"{self.block_n}, {self.threads}>")

    @property
    def combine_expr(self) -> str:
        return f"attn_splitkv_combine<{OUT_CPP[self.dtype]}, {LSE_CPP[self.dtype]}, {COMBINE_THREADS}>"

    @property
    def name_expressions(self) -> tuple[str, str]:
        return (self.fwd_expr, self.combine_expr)

    @property
    def mma_exp2(self) -> bool:
        """FlashAttention 2's exponentials (ATTN_MMA_EXP2): MMA_PREFILL_TABLE's choice for a
        prefill tile of its head dims and keys, off for decode; ATTNSWEEP_MMA_EXP2 overrides."""
        if self.path != "mma":
            return False
        if MMA_EXP2 is not None:
            return bool(MMA_EXP2)
        tile_n, exp2 = _prefill_tiles(self.dqk_bucket + self.dv_bucket)
        return self.block_m == 64 and exp2 and self.tile_n == tile_n

    def macro_options(self) -> list[str]:
        mma = [f"-DATTN_MMA_Q_SMEM_FROM={MMA_Q_SMEM_FROM}"] if self.path == "mma" else []
        if self.mma_exp2:
            mma.append("-DATTN_MMA_EXP2=1")
        return mma + [f"-D{defect_macro(d)}=1" for d in self.defects]


def grouped_rows(config: AttentionConfig) -> int:
    """Query rows per block on the grouped path: all rows of a kv head, up to GROUPED_MAX_ROWS,
    as a power of two."""
    rows = config.gqa_ratio * config.seq_len_q
    rb = 1
    while rb < min(rows, GROUPED_MAX_ROWS):
        rb *= 2
    return rb


def mma_applies(config: AttentionConfig) -> bool:
    """The tensor-core path's conditions: f16/bf16, head dims multiples of 8 up to 256 (16-byte
    chunks; the bucket's rest is zero-filled), Q, K and V rows contiguous (not transposed)."""
    c = config
    return (c.dtype in MMA_DTYPES and c.head_dim_qk <= 256 and c.head_dim_v <= 256
            and c.head_dim_qk % 8 == 0 and c.head_dim_v % 8 == 0
            and not (c.trans_q or c.trans_k or c.trans_v))


# The mma path's decode shapes by head-dim buckets (dqk + dv): keys per tile, warps splitting a
# tile's keys, blocks per SM its register budget must allow. Measured on the H200
# (bench/tune_mma.py; docs/decisions.md).
MMA_DECODE_SHAPES = (   # (dqk + dv up to, tile_n, key_groups, min_blocks)
    (128, 128, 4, 2),
    (256, 128, 4, 2),
    (512, 64, 4, 2),
)
DEFAULT_MAX_SHARED = 48 * 1024   # what a kernel gets without opting in to more
# Dynamic shared memory one block of the mma path may ask for: past DEFAULT_MAX_SHARED the backend
# opts the kernel in (_rt_allow_shared). 99 KB is the opt-in limit of sm_86/sm_89, the smallest
# of the devices with mma.sync (sm_80: 163 KB, sm_90: 227 KB).
MMA_MAX_SHARED = 99 * 1024
# The mma decode kernel's fused combine (fuses_combine): one level (the last block of a row tile
# reads every split) up to FUSED_COMBINE_ONE_LEVEL splits, two past it (fused_combine_group), up
# to FUSED_COMBINE_MAX_SPLITS; past that the combine kernel runs. The one level was measured
# faster than the combine kernel at 3 and 6 splits and slower at 47 (docs/decisions.md); the two
# levels pass the GPU tests but were slower too (H200: 30.7 against 20.5 µs at 128 splits on
# (1,8,1,65536,128); with the combine read in registers, H100: 28.1 against 22.9), so by default
# they stay off (8); ATTNSWEEP_FUSED_COMBINE_MAX_SPLITS=1024 turns them on for a kernel or device
# where that may differ.
FUSED_COMBINE_ONE_LEVEL = 8
FUSED_COMBINE_MAX_SPLITS = int(os.environ.get("ATTNSWEEP_FUSED_COMBINE_MAX_SPLITS", "8"))


def mma_shape(config: AttentionConfig, dqk_bucket: int, dv_bucket: int) -> dict[str, int]:
    """block_m, threads, tile_n, min_blocks (and row_tiles) of the mma path. Decode (a kv head's rows fit one
    16-row tile): one row tile, each tile's keys split over 16-key warp groups
    (MMA_DECODE_SHAPES). Otherwise (prefill) four warps of MMA_PREFILL_ROW_TILES 16-row tiles each
    (one past 256 summed head dims) and the keys a tile MMA_PREFILL_TABLE gives their head dims
    (ATTNSWEEP_MMA_PREFILL_TILE_N where set; 64 with two row tiles; 32 where both head dims
    together pass 256)."""
    if config.gqa_ratio * config.seq_len_q <= MMA_DECODE_ROWS:
        _, tile_n, groups, min_blocks = next(x for x in MMA_DECODE_SHAPES if dqk_bucket + dv_bucket <= x[0])
        return {"block_m": 16, "threads": 32 * groups, "tile_n": tile_n, "min_blocks": min_blocks}
    if MMA_PREFILL_ROW_TILES > 1 and dqk_bucket + dv_bucket <= 256:
        return {"block_m": 64 * MMA_PREFILL_ROW_TILES, "threads": 128, "tile_n": 64, "min_blocks": 1,
                "row_tiles": MMA_PREFILL_ROW_TILES}
    tile_n, _ = _prefill_tiles(dqk_bucket + dv_bucket)
    if MMA_PREFILL_TILE_N is not None and dqk_bucket + dv_bucket <= 256:
        tile_n = MMA_PREFILL_TILE_N
    return {"block_m": 64, "threads": 128, "tile_n": tile_n, "min_blocks": 1}


def select_variant(config: AttentionConfig, defects: frozenset[str] | Sequence[str] = (),
                   path: str = "auto", *, mma: bool = False) -> Variant:
    """The variant a config runs on. Raises NotApplicable only past the launch limits.

    `auto` takes the mma path (tensor cores) where the device has it (`mma`: NVIDIA sm_80 and
    newer) and mma_applies, else the grouped path (K/V read once per group of query rows,
    16-byte loads) where it applies — f16, bf16, f32 with both head dims <= 256 — and the
    rowwise path elsewhere; a named path forces that path (to compare them on one config)."""
    rows = config.g * config.num_heads_q * config.seq_len_q
    if rows > MAX_GRID_X:
        raise NotApplicable("grid_too_large", f"g*num_heads_q*seq_len_q={rows} > {MAX_GRID_X}")
    if config.split_kv > min(MAX_GRID_Y, MAX_SPLITS):
        raise NotApplicable("grid_too_large", f"split_kv={config.split_kv} > {min(MAX_GRID_Y, MAX_SPLITS)}")
    if path not in ("auto", *PATHS):
        raise ValueError(f"path: unknown {path!r}; choose auto or one of {PATHS}")
    dqk, dv = head_dim_bucket(config.head_dim_qk), head_dim_bucket(config.head_dim_v)
    grouped = config.dtype in GROUPED_DTYPES and GENERAL_BUCKET not in (dqk, dv)
    if path == "grouped" and not grouped:
        raise NotApplicable("path_not_applicable", "the grouped path needs f16/bf16/f32 and head dims <= 256")
    if path == "mma" and not (mma and mma_applies(config)):
        raise NotApplicable("path_not_applicable", "the mma path needs an NVIDIA sm_80+ GPU, f16/bf16, head dims "
                            "multiples of 8 up to 256 and untransposed Q, K, V")
    if path == "mma" or (path == "auto" and mma and mma_applies(config)):
        return Variant(dtype=config.dtype, dqk_bucket=dqk, dv_bucket=dv, defects=tuple(sorted(set(defects))),
                       path="mma", **mma_shape(config, dqk, dv))
    if path == "rowwise" or not grouped:
        return Variant(dtype=config.dtype, dqk_bucket=dqk, dv_bucket=dv, defects=tuple(sorted(set(defects))))
    return Variant(dtype=config.dtype, dqk_bucket=dqk, dv_bucket=dv, block_m=grouped_rows(config),
                   defects=tuple(sorted(set(defects))), path="grouped")


@lru_cache(maxsize=1)
def local_source() -> KernelSource:
    """The workers' own kernels/src: what a sweep without a source bundle compiles."""
    return KernelSource.from_dir(SRC_DIR, SOURCE_FILE, HEADER_FILES)


def load_sources() -> tuple[str, dict[str, str], str]:
    """(attention.hip text, {header name: text}, sha256 of all of them) of the local source."""
    src = local_source()
    return src.entry_text, dict(src.headers), src.hash


def source_hash() -> str:
    return local_source().hash


# ---- launch plan ----------------------------------------------------------------------------
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
    a group and the last of the groups' combiners each read about sqrt(splits) partials. One
    block reading 47 splits' partials was 3 to 16 µs slower than the combine kernel (H200,
    2026-12-04, docs/decisions.md)."""
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
    reads as the split kernel wrote them, and not in splitkv_extra_bytes (SPEC §6 budgets the
    partials): about sqrt(split_kv) / split_kv of them more."""
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


# ---- host-side tensors ----------------------------------------------------------------------
def _storage_dtypes(dtype: str) -> dict[str, np.dtype]:
    import ml_dtypes

    fl = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32)}
    if dtype == "i8":
        return {"qk": np.dtype(np.int8), "v": np.dtype(np.float16), "o": np.dtype(np.float16),
                "lse": np.dtype(np.float16)}
    return {"qk": fl[dtype], "v": fl[dtype], "o": fl[dtype], "lse": np.dtype(np.float32)}


# NaN bit patterns used to prefill outputs (a kernel that writes nothing then fails).
NAN_BITS = {2: 0x7E00, 4: 0x7FC00000}          # f16 quiet NaN; f32 quiet NaN
BF16_NAN_BITS = 0x7FC0


def output_buffers(config: AttentionConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The device buffers a call writes, by launch_plan's names: (physical shape, dtype). O in
    its layout, the LSE where asked for, and the split partials. DeviceBackend.run and
    bench/kernels.py allocate from here, so the benchmark times the writes a sweep runs."""
    c = config
    dt = _storage_dtypes(c.dtype)
    o_shape = ((c.g, c.num_heads_q, c.head_dim_v, c.seq_len_q) if c.trans_o
               else (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v))
    outputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {"o": (o_shape, dt["o"])}
    if c.return_lse:
        outputs["lse"] = ((c.g, c.num_heads_q, c.seq_len_q), dt["lse"])
    if c.split_kv > 1:
        outputs["o_part"] = ((c.split_kv, c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), np.dtype(np.float32))
        outputs["lse_part"] = ((c.split_kv, c.g, c.num_heads_q, c.seq_len_q), np.dtype(np.float32))
    return outputs


def nan_fill_pattern(dtype: np.dtype) -> tuple[int, int]:
    """(element size, bit pattern) of a quiet NaN in `dtype`."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 4:
        return 4, NAN_BITS[4]
    if dtype == np.float16:
        return 2, NAN_BITS[2]
    if dtype.itemsize == 2:  # bfloat16
        return 2, BF16_NAN_BITS
    raise ValueError(f"no NaN pattern for {dtype}")


def to_physical(x: np.ndarray, trans: bool) -> np.ndarray:
    from reference.layout import to_physical as _tp

    return _tp(x, trans)


def to_logical(x: np.ndarray, trans: bool) -> np.ndarray:
    from reference.layout import to_logical as _tl

    return _tl(x, trans)


@dataclass
class LoadedVariant:
    """A variant loaded on the device: its module and the two functions."""

    variant: Variant
    module: Any
    functions: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Compiled:
    """What a compiler produced: the binary and name expression -> lowered name."""

    binary: bytes
    lowered_names: dict[str, str]
    log: str = ""


class DeviceBackend(Backend, abc.ABC):
    """The runtime-neutral GPU backend; subclasses implement the `_rt_*` runtime calls."""

    waits_on_device = True
    #: arch string for the cache key (sm_90, gfx942...); set by the subclass constructor
    arch: str = ""
    #: a source bundle to compile instead of the local kernels/src; set by the subclass constructor
    kernel_source: KernelSource | None = None

    @property
    def source(self) -> KernelSource:
        return self.kernel_source or self._local_source

    @cached_property
    def _local_source(self) -> KernelSource:
        # Read once: prepare asks for the hash of every config, and the hash and the text
        # compiled must come from one reading of kernels/src.
        return local_source()

    def __init__(self, defects: frozenset[str] = frozenset(), *, cache: Any = None):
        super().__init__(defects)
        from kernels.cache import KernelCache

        self.cache = cache if cache is not None else KernelCache()
        self._loaded: dict[str, LoadedVariant] = {}
        self.last_alloc: dict[str, int] = {}   # bytes of each output buffer of the last run
        #: bytes of guard zone on each side of every input and output (kernels/guards.py);
        #: bench/sweep.py sets 0 to measure what they cost
        self.guard_bytes = GUARD_BYTES

    # -- runtime calls ------------------------------------------------------------------------
    @abc.abstractmethod
    def compiler_version(self) -> str: ...

    @abc.abstractmethod
    def compile_options(self, variant: Variant) -> list[str]: ...

    @abc.abstractmethod
    def _rt_compile(self, variant: Variant, options: list[str]) -> Compiled: ...

    @abc.abstractmethod
    def _rt_load(self, compiled: Compiled) -> Any: ...

    @abc.abstractmethod
    def _rt_get_function(self, module: Any, lowered_name: str) -> Any: ...

    def _rt_allow_shared(self, function: Any, nbytes: int) -> None:
        """Let `function` launch with `nbytes` of dynamic shared memory (past DEFAULT_MAX_SHARED
        a kernel must opt in); only the mma path asks for that much, and only CUDA runs it."""
        if nbytes > DEFAULT_MAX_SHARED:
            raise NotImplementedError(f"{self.name}: {nbytes} B of dynamic shared memory needs an opt-in")

    @abc.abstractmethod
    def _rt_malloc(self, nbytes: int) -> int: ...

    @abc.abstractmethod
    def _rt_free(self, dptr: int) -> None: ...

    @abc.abstractmethod
    def _rt_htod(self, dptr: int, host: np.ndarray) -> None: ...

    @abc.abstractmethod
    def _rt_dtoh(self, host: np.ndarray, dptr: int) -> None: ...

    @abc.abstractmethod
    def _rt_memset(self, dptr: int, elem_size: int, pattern: int, count: int) -> None: ...

    @abc.abstractmethod
    def _rt_launch(self, function: Any, launch: Launch) -> None: ...

    @abc.abstractmethod
    def _rt_event_pair(self) -> tuple[Any, Any]: ...

    @abc.abstractmethod
    def _rt_record(self, event: Any) -> None: ...

    @abc.abstractmethod
    def _rt_elapsed_s(self, start: Any, stop: Any) -> float:
        """Synchronize on `stop` and return the time between the two events in seconds."""

    @abc.abstractmethod
    def _rt_event_destroy(self, event: Any) -> None: ...

    @abc.abstractmethod
    def _rt_activate(self) -> None:
        """Make this backend's device current in the calling thread."""

    # -- prepare --------------------------------------------------------------------------------
    #: "auto" (the fastest path that applies), or a path of PATHS to force it (tests, benchmarks)
    kernel_path: str = "auto"
    #: whether the device runs the mma path (NVIDIA sm_80+); set by the subclass constructor
    mma_capable: bool = False
    #: whether the mma decode kernel combines the splits itself (fuses_combine); False: two launches
    fuse_combine: bool = True

    def variant_for(self, config: AttentionConfig) -> Variant:
        return select_variant(config, self.defects, self.kernel_path, mma=self.mma_capable)

    def combine_counters(self, config: AttentionConfig, variant: Variant) -> int:
        """int32 counters a call needs, zeroed (fused_combine_counters), when the split kernel
        combines itself (fuse_combine and fuses_combine); 0: the combine kernel runs."""
        return fused_combine_counters(config, variant) if self.fuse_combine and fuses_combine(config, variant) else 0

    def combine_scratch(self, config: AttentionConfig, variant: Variant) -> dict[str, tuple[int, np.dtype, bool]]:
        """The device buffers a call needs beside its inputs and outputs, by launch_plan's names:
        (elements, dtype, whether zeroed). The fused combine's counters and, with two levels,
        its group partials; none where the combine kernel runs. Every caller that builds a
        launch_plan's buffers (run below, bench/kernels.py) allocates from here."""
        counters = self.combine_counters(config, variant)
        if not counters:
            return {}
        scratch = {"combine_count": (counters, np.dtype(np.int32), True)}
        part_floats = fused_combine_part_floats(config)
        if part_floats:
            scratch["combine_part"] = (part_floats, np.dtype(np.float32), False)
        return scratch

    def cache_key_fields(self, variant: Variant, options: list[str]) -> dict[str, Any]:
        return {
            "variant": variant.name,
            "name_expressions": list(variant.name_expressions),
            "source_hash": self.source.hash,
            "options": options,
            "arch": self.arch,
            "compiler": self.compiler_version(),
            "backend": self.name,
        }

    def prepare(self, config: AttentionConfig) -> Prepared:
        variant = self.variant_for(config)
        loaded = self._loaded.get(variant.name)
        if loaded is not None and self.cache.enabled:
            return Prepared(variant.name, variant.block_n, self.source.hash, 0.0, True, loaded)
        self._rt_activate()
        options = self.compile_options(variant)
        result = self.cache.load_or_compile(
            variant.name, self.cache_key_fields(variant, options),
            lambda: self._rt_compile(variant, options))
        compiled = result.compiled
        module = self._rt_load(compiled)
        functions = {
            "fwd": self._rt_get_function(module, compiled.lowered_names[variant.fwd_expr]),
            "combine": self._rt_get_function(module, compiled.lowered_names[variant.combine_expr]),
        }
        self._rt_allow_shared(functions["fwd"], variant.shared_bytes)
        loaded = LoadedVariant(variant, module, functions)
        self._loaded[variant.name] = loaded
        return Prepared(variant.name, variant.block_n, self.source.hash, result.compile_s, result.hit, loaded)

    # -- run ------------------------------------------------------------------------------------
    def partial_bytes(self, config: AttentionConfig) -> int:
        """Bytes this backend allocates for the split-KV partials (== splitkv_extra_bytes)."""
        if config.split_kv == 1:
            return 0
        rows = config.split_kv * config.g * config.num_heads_q * config.seq_len_q
        return rows * config.head_dim_v * 4 + rows * 4

    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        loaded: LoadedVariant = prepared.handle
        if loaded is None or loaded.variant.name != prepared.variant:
            raise ValueError(f"prepared handle does not hold variant {prepared.variant}")
        c = config
        variant = loaded.variant
        dt = _storage_dtypes(c.dtype)
        self._rt_activate()

        host: dict[str, np.ndarray] = {
            "q": to_physical(np.asarray(inputs["q"], dtype=dt["qk"]), c.trans_q),
            "k": to_physical(np.asarray(inputs["k"], dtype=dt["qk"]), c.trans_k),
            "v": to_physical(np.asarray(inputs["v"], dtype=dt["v"]), c.trans_v),
        }
        if c.with_attn_bias:
            host["bias"] = np.ascontiguousarray(np.asarray(inputs["bias"], dtype=dt["v"]))
        if c.causal and c.prefix_offset is not None:
            host["prefix_offset"] = np.asarray(c.prefix_offset, dtype=np.int32)
        if c.current_seq_len is not None:
            host["current_seq_len"] = np.asarray(c.current_seq_len, dtype=np.int32)

        outputs = output_buffers(c)
        part_bytes = sum(int(np.prod(outputs[k][0])) * 4 for k in ("o_part", "lse_part") if k in outputs)
        expected = splitkv_extra_bytes(c)
        if part_bytes != expected or part_bytes != self.partial_bytes(c):
            raise AssertionError(f"partial buffers {part_bytes} B != splitkv_extra_bytes {expected} B")

        buf: dict[str, int] = {}
        allocs: list[int] = []
        guard = self.guard_bytes
        events: tuple[Any, Any] | None = None
        try:
            t0 = time.perf_counter()
            for name, arr in host.items():
                base = self._rt_malloc(padded_bytes(max(arr.nbytes, 1), guard))
                allocs.append(base)
                if guard:   # NaN (or the largest integer) around it: see kernels/guards.py
                    size, pattern = fill_value_bits(arr.dtype)
                    self._rt_memset(base, size, pattern, padded_bytes(max(arr.nbytes, 1), guard) // size)
                buf[name] = base + guard
                self._rt_htod(buf[name], arr)
            for name, (shape, dtype) in outputs.items():
                count = int(np.prod(shape))
                base = self._rt_malloc(padded_bytes(count * dtype.itemsize, guard))
                allocs.append(base)
                if guard:
                    self._rt_memset(base, 1, CANARY, padded_bytes(count * dtype.itemsize, guard))
                buf[name] = base + guard
                size, pattern = nan_fill_pattern(dtype)
                self._rt_memset(buf[name], size, pattern, count)
            self.last_alloc = {k: int(np.prod(s)) * d.itemsize for k, (s, d) in outputs.items()}
            scratch = self.combine_scratch(c, variant)
            for name, (count, dtype, zeroed) in scratch.items():
                buf[name] = self._rt_malloc(count * dtype.itemsize)
                allocs.append(buf[name])
                if zeroed:
                    self._rt_memset(buf[name], dtype.itemsize, 0, count)
            counters = scratch["combine_count"][0] if scratch else 0
            transfer_s = time.perf_counter() - t0

            launches = launch_plan(c, variant, buf, quant_scale=float(inputs.get("quant_scale", 1.0)),
                                   quant_zero_point=int(inputs.get("quant_zero_point", 0)))
            events = self._rt_event_pair()
            self._rt_record(events[0])
            for launch in launches:
                self._rt_launch(loaded.functions[launch.kernel], launch)
            self._rt_record(events[1])
            run_s = self._rt_elapsed_s(*events)
            if counters:   # the last block of every row tile must have combined and re-armed
                counts = np.empty(counters, dtype=np.int32)
                self._rt_dtoh(counts, buf["combine_count"])
                if counts.any():
                    raise LaunchError(f"fused combine: {int((counts != 0).sum())} of {counters} counters left "
                                      "armed (no block saw itself last)")

            t1 = time.perf_counter()
            got = {}
            violations = []
            for name, (shape, dtype) in outputs.items():
                nbytes = int(np.prod(shape)) * dtype.itemsize
                raw = np.empty(padded_bytes(nbytes, guard), dtype=np.uint8)
                self._rt_dtoh(raw, buf[name] - guard)   # the output and its guards in one copy
                violation = check_guards(name, raw, nbytes, dtype.itemsize, guard)
                if violation is not None:
                    violations.append(violation.describe())
                got[name] = raw[guard:guard + nbytes].view(dtype).reshape(shape)
            transfer_s += time.perf_counter() - t1
            if violations:
                raise DeviceFault("; ".join(violations), poisons=False)
        finally:
            if events is not None:
                for ev in events:
                    self._safe(self._rt_event_destroy, ev)
            for dptr in allocs:
                self._safe(self._rt_free, dptr)

        return RunOutput(
            out=to_logical(got["o"], c.trans_o),
            lse=got.get("lse"),
            o_partials=got.get("o_part"),
            lse_partials=got.get("lse_part"),
            run_s=run_s,
            transfer_s=transfer_s,
        )

    @staticmethod
    def _safe(fn: Any, *args: Any) -> None:
        """Cleanup must not hide the error that got us here (a sticky launch error, say)."""
        try:
            fn(*args)
        except (LaunchError, DeviceOutOfMemory, DeviceFault):
            pass


def pack_kernel_params(args: Sequence[Arg]) -> tuple[Any, list[Any]]:
    """A void*[] of pointers to each argument (cuLaunchKernel's kernelParams) and the keep-alive list."""
    objs = [a.as_ctypes() for a in args]
    arr = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
    return arr, objs


def variant_key(config: AttentionConfig, defects: Sequence[str] = ()) -> str:
    """The name of the variant any GPU backend would compile for `config` (or the reason none
    applies): what a task batch and the sanitizer's stratified share group configs by. mma=True:
    its variants partition configs more finely than any other device's, so a group holds one
    variant whatever GPU runs it."""
    try:
        return select_variant(config, frozenset(defects), mma=True).name
    except NotApplicable as exc:
        return f"not_applicable:{exc.reason}"
