"""Kernel variants and which one a config runs: light enough for the API process, which groups
configs by variant (variant_key) and must not load a backend, the compile cache or a GPU runtime.

A *variant* is one compilation of kernels/src/attention.hip: every compile-time parameter is in
its deterministic name (dtype, head-dim buckets, block_n, block_m, threads, path, the mma
path's tile, defects), so two configs that need the same binary share it and the compile
cache can key on the name.

Head dims are bucketed: a head dim d in 1..256 runs in the smallest bucket of
HEAD_DIM_BUCKETS that holds it (compile-time loop bounds, masked against the runtime d); a
head dim above 256 runs on the general path (bucket 0, written `any`: runtime loop bounds, any
size up to 1024). So every config of the space has a variant and `NotApplicable` is reserved
for launch limits no sampled config reaches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from attnconfig import AttentionConfig
from kernels.defects import DEFECTS
from kernels.errors import NotApplicable
from kernels.tuning import (
    GROUPED_MAX_ROWS,
    MMA_DECODE_ROWS,
    MMA_DECODE_SHAPES,
    MMA_Q_SMEM_FROM,
    prefill_tiles,
)

HEAD_DIM_BUCKETS = (32, 64, 128, 256)   # compile-time buckets; above the last: general path
GENERAL_BUCKET = 0
DEFAULT_BLOCK_N = 32                    # keys per KV block (docs/spec.md §3 block_n)
DEFAULT_BLOCK_M = 1                     # query rows per thread block (rowwise path)
DEFAULT_THREADS = 128                   # threads per block (must be a multiple of block_n)
COMBINE_THREADS = 256                   # threads per block of the combine kernel
MAX_SPLITS = 1024                       # the combine's shared weights (ATTN_MAX_SPLITS)
GROUPED_DTYPES = ("f16", "bf16", "f32")
MMA_DTYPES = ("f16", "bf16")            # the tensor-core path (NVIDIA sm_80+, attn_splitkv_fwd_mma)
PATHS = ("rowwise", "grouped", "mma")
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535
# Dynamic shared memory one block of the mma path may ask for: past launch.DEFAULT_MAX_SHARED
# the backend opts the kernel in. 99 KB is the opt-in limit of sm_86/sm_89, the smallest of the
# devices with mma.sync (sm_80: 163 KB, sm_90: 227 KB).
MMA_MAX_SHARED = 99 * 1024

# C++ spellings of the kernels' template arguments (HIP names; hip_compat.h maps them on CUDA).
QK_CPP = {"f16": "__half", "bf16": "__hip_bfloat16", "f32": "float", "i8": "signed char"}
OUT_CPP = {"f16": "__half", "bf16": "__hip_bfloat16", "f32": "float", "i8": "__half"}
LSE_CPP = {"f16": "float", "bf16": "float", "f32": "float", "i8": "__half"}
# The kernels' names in the source (kernels/src/attention.hip): the split kernels, one per path
# (attn_splitkv_fwd, _grouped, _mma, all with this prefix), and the combine every path launches
# when split_kv > 1 and its split kernel does not fuse it. Fault details name them (the writer of
# a buffer whose guard zone changed), and triage locates a fault by them.
SPLIT_KERNEL = "attn_splitkv_fwd"
COMBINE_KERNEL = "attn_splitkv_combine"


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
            if self.tile_n % (self.key_groups * 16):
                raise ValueError(f"mma path: tile_n={self.tile_n} gives a warp fewer than 16 keys")
            if not 1 <= self.min_blocks <= 8:
                raise ValueError("mma path: min_blocks must be in 1..8")
            if self.shared_bytes > MMA_MAX_SHARED:
                raise ValueError(f"mma path: {self.shared_bytes} B of shared memory per block > {MMA_MAX_SHARED} "
                                 "(the smallest opt-in limit of the devices with mma.sync)")
        elif self.tile_n or self.min_blocks:
            raise ValueError("tile_n, min_blocks: only the mma path has shared-memory tiles")
        if tuple(sorted(set(self.defects))) != self.defects:
            raise ValueError("defects: must be sorted and unique")
        for d in self.defects:
            defect_macro(d)

    @property
    def name(self) -> str:
        base = (f"attn_{self.dtype}_qk{_bucket_label(self.dqk_bucket)}_v{_bucket_label(self.dv_bucket)}"
                f"_n{self.block_n}_m{self.block_m}_t{self.threads}")
        if self.path == "mma":
            base += f"_k{self.tile_n}_b{self.min_blocks}"
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
        """mma path: warps along the rows (WM), each taking one 16-row tile."""
        return self.block_m // 16 if self.path == "mma" else 1

    @property
    def key_groups(self) -> int:
        """mma path: warps that split each tile's keys (WN); the others are row warps (WM)."""
        return self.threads // 32 // self.row_warps if self.path == "mma" else 1

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of the split kernel (AttnMmaSmem in attention.hip; the kernel
        traps if it gets less): room for one K and one V tile of padded rows (the swizzled rows
        of head dims 64, 128 and 256 use less of it) and, from DQK bucket MMA_Q_SMEM_FROM on,
        for the block's Q rows; or the key groups' merge if larger."""
        if self.path != "mma":
            return 0
        q_rows = self.block_m * (self.dqk_bucket + 8) * 2 if self.dqk_bucket >= MMA_Q_SMEM_FROM else 0
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
                    f"{self.block_n}, {self.tile_n}, {self.row_warps}, {self.key_groups}, {self.min_blocks}>")
        if self.path == "grouped":
            return (f"attn_splitkv_fwd_grouped<{QK_CPP[self.dtype]}, {self.dqk_bucket}, {self.dv_bucket}, "
                    f"{self.block_n}, {self.threads}, {self.block_m}>")
        return (f"attn_splitkv_fwd<{QK_CPP[self.dtype]}, {self.dqk_bucket}, {self.dv_bucket}, "
                f"{self.block_n}, {self.threads}>")

    @property
    def combine_expr(self) -> str:
        return f"{COMBINE_KERNEL}<{OUT_CPP[self.dtype]}, {LSE_CPP[self.dtype]}, {COMBINE_THREADS}>"

    def kernel_function(self, kernel: str) -> str:
        """The source name of one of its launches' kernels (kernels/launch.py Launch.kernel:
        "fwd" or "combine"), without template arguments."""
        return (self.fwd_expr if kernel == "fwd" else self.combine_expr).split("<", 1)[0]

    @property
    def name_expressions(self) -> tuple[str, str]:
        return (self.fwd_expr, self.combine_expr)

    @property
    def mma_exp2(self) -> bool:
        """FlashAttention 2's exponentials (ATTN_MMA_EXP2): MMA_PREFILL_TABLE's choice for a
        prefill tile of its head dims and keys, off for decode."""
        if self.path != "mma":
            return False
        tile_n, exp2 = prefill_tiles(self.dqk_bucket + self.dv_bucket)
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


def mma_shape(config: AttentionConfig, dqk_bucket: int, dv_bucket: int) -> dict[str, int]:
    """block_m, threads, tile_n and min_blocks of the mma path. Decode (a kv head's rows fit one
    16-row tile): one row tile, each tile's keys split over 16-key warp groups
    (MMA_DECODE_SHAPES). Otherwise (prefill) four warps of one 16-row tile each and the keys a
    tile MMA_PREFILL_TABLE gives their head dims."""
    if config.gqa_ratio * config.seq_len_q <= MMA_DECODE_ROWS:
        _, tile_n, groups, min_blocks = next(x for x in MMA_DECODE_SHAPES if dqk_bucket + dv_bucket <= x[0])
        return {"block_m": 16, "threads": 32 * groups, "tile_n": tile_n, "min_blocks": min_blocks}
    tile_n, _ = prefill_tiles(dqk_bucket + dv_bucket)
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


def variant_key(config: AttentionConfig, defects: Sequence[str] = ()) -> str:
    """The name of the variant any GPU backend would compile for `config` (or the reason none
    applies): what a task batch and the sanitizer's stratified share group configs by. mma=True:
    its variants partition configs more finely than any other device's, so a group holds one
    variant whatever GPU runs it."""
    try:
        return select_variant(config, frozenset(defects), mma=True).name
    except NotApplicable as exc:
        return f"not_applicable:{exc.reason}"
