"""The measured tables that shape the kernel variants: each holds the choice its measurement made,
and docs/decisions.md holds the numbers (dated, with device and commit).

Nothing here reads the environment: a table changes with a new measurement, in this file.
"""
from __future__ import annotations

# Query rows sharing one K/V pass on the grouped path, at most: 8 ran out of registers.
GROUPED_MAX_ROWS = 4

# The mma path reads Q's fragments from shared memory, not registers, from this DQK bucket on
# (attention.hip ATTN_MMA_Q_SMEM_FROM, passed by Variant.macro_options): at D = 256 they spilled
# in registers (docs/decisions.md, "The tensor-core path").
MMA_Q_SMEM_FROM = 256

# Prefill's key tile and softmax exponentials by the head dims' buckets summed (qk + v), the
# fastest of tools/tune_mma.py --prefill (docs/decisions.md, "Prefill tiles and exponentials by
# head dim"): (summed dims up to, keys a tile, ATTN_MMA_EXP2).
#   <= 64:  64 keys
#   <= 128: 128 keys and ATTN_MMA_EXP2 (FlashAttention 2's one FFMA and one ex2 a score)
#   <= 256: 128 keys, expf (EXP2 slows this one)
#   past:   PREFILL_TILE_N_PAST keys (shared memory)
MMA_PREFILL_TABLE = ((64, 64, 0), (128, 128, 1), (256, 128, 0))
MMA_PREFILL_TILE_N_PAST = 32

# Rows per kv head up to which the mma path runs its decode shape (one 16-row tile whose keys
# split over key groups).
MMA_DECODE_ROWS = 16
# The mma path's decode shapes by head-dim buckets (dqk + dv): keys per tile, warps splitting a
# tile's keys, blocks per SM its register budget must allow: the fastest of tools/tune_mma.py
# (docs/decisions.md, "The tensor-core path").
MMA_DECODE_SHAPES = (   # (dqk + dv up to, tile_n, key_groups, min_blocks)
    (128, 128, 4, 2),
    (256, 128, 4, 2),
    (512, 64, 4, 2),
)

# The mma decode kernel's fused combine (launch.fuses_combine): one level (the last block of a
# row tile reads every split) up to FUSED_COMBINE_ONE_LEVEL splits, two levels past it up to
# FUSED_COMBINE_MAX_SPLITS; past that the combine kernel runs. The one level is faster than the
# combine kernel at few splits and slower at many; the two levels pass the GPU tests but are
# slower than the combine kernel (docs/decisions.md, "Decode's fixed costs: the combine"), so the
# maximum equals the one level's: the two-level code runs in the tests (launch.fuses_combine's
# max_splits) alone.
FUSED_COMBINE_ONE_LEVEL = 8
FUSED_COMBINE_MAX_SPLITS = 8


def prefill_tiles(dims: int) -> tuple[int, bool]:
    """MMA_PREFILL_TABLE's (keys a tile, ATTN_MMA_EXP2) for head-dim buckets summing to `dims`."""
    return next(((t, bool(exp2)) for limit, t, exp2 in MMA_PREFILL_TABLE if dims <= limit),
                (MMA_PREFILL_TILE_N_PAST, False))
