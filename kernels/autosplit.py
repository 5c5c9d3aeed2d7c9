"""The automatic split count (`split_kv=0` in the library): how many splits keep every SM busy.

Split-KV pays for partials and a combine; it is worth it only when the blocks of one split
leave SMs idle. FlashAttention's `num_splits_heuristic` weighs this by wave efficiency: with
`units` blocks per split and `slots` blocks the GPU runs at once, s splits fill
n = units * s / slots waves, and the last wave is n / ceil(n) full. It takes the smallest s
whose efficiency is within a share of the best (85%), among split counts that change the keys
per split. Two changes, each measured faster (docs/decisions.md, "Automatic split count"):
- the efficiency also counts the last split's part-empty tile: a block's time is its split's
  ceil(key_tiles / s) tiles, so efficiency = ideal / (ceil(n) * ceil(key_tiles / s)) with
  ideal = units * key_tiles / slots. Without it, 61 splits of 1024 tiles (17 tiles each) rate
  as well as 64 (16 each), which finish sooner.
- the share is 95%: FlashAttention's compute-bound blocks lose little in a part-empty wave, our
  latency-bound decode blocks do (85% picks 7 splits for (8,32,8,32768,128), where 8 are
  faster).
We count slots as SMs x resident blocks per SM (several of our blocks share an SM), and a split
needs at least one tile of keys (`tile_keys`, the keys a block reads per step). A third change
for the memory-bound mma decode kernel: it does not split when its unsplit blocks already fill
the SMs with as many as stream at memory speed (mma_saturating_blocks: one per SM up to head
dims 128, two past them), where FlashAttention's rule waits for 80% of every slot: the unsplit
kernel then streams as fast, and a split adds the combine.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from attnconfig import AttentionConfig

# FlashAttention's cap. With the mma decode tile of 128 keys, a cap of 256 gave (1,8,1,65536,128)
# 256 splits of 2 tiles each, slower than 128 splits of 4: a block that streams only two tiles
# spends as long starting and ending as reading, and the combine reads twice the partials.
DEFAULT_MAX_SPLITS = 128
EFFICIENCY_SHARE = 0.95
# Blocks per SM of the mma kernel that already stream at the memory's speed: two resident
# blocks per SM read as fast as three.
MMA_SATURATING_BLOCKS_PER_SM = 2
# Up to head dims 128 (dqk + dv buckets up to 256) one decode block per SM does: 128 unsplit
# blocks run as fast as 2 splits of them or faster. At D = 256 two are needed. The timings behind
# these three constants: docs/decisions.md, "Automatic split count".
MMA_DECODE_STREAMING_DIMS = 256


def num_splits_heuristic(units: int, slots: int, key_tiles: int, max_splits: int = DEFAULT_MAX_SPLITS,
                         share: float = EFFICIENCY_SHARE, count_tiles: bool = True,
                         saturating: int | None = None) -> int:
    """The split count for `units` blocks per split, `slots` concurrent blocks and `key_tiles`
    tiles of keys. share=0.85, count_tiles=False is FlashAttention's rule as it stands.
    `saturating`: the blocks that already keep the memory busy (default: slots); with 80% of
    them in one split, splitting only adds the combine."""
    if units >= 0.8 * (saturating or slots):
        return 1
    max_splits = max(1, min(max_splits, slots, key_tiles))

    def ceil_div(a: int, b: int) -> int:
        return -(-a // b)

    def eligible(s: int) -> bool:
        return s == 1 or ceil_div(key_tiles, s) != ceil_div(key_tiles, s - 1)

    def efficiency(s: int) -> float:
        waves = units * s / slots
        if not count_tiles:
            return waves / math.ceil(waves)
        return (units * key_tiles / slots) / (math.ceil(waves) * ceil_div(key_tiles, s))

    eff = {s: efficiency(s) for s in range(1, max_splits + 1) if eligible(s)}
    best = max(eff.values())
    return next(s for s in sorted(eff) if eff[s] >= share * best)


def choose_split_kv(config: AttentionConfig, num_sms: int, blocks_per_sm: int | None = None,
                    tile_keys: int | None = None, max_splits: int = DEFAULT_MAX_SPLITS, *,
                    mma: bool = False) -> int:
    """The split count for `config` on a GPU with `num_sms` SMs (the config's own split_kv is
    ignored). `mma`: the device runs the tensor-core path. Blocks per SM and keys per tile
    default to the variant's: the grouped path steps by 128 keys with 4 blocks per SM, the
    mma path by its tile_n with the variant's min_blocks (MMA_DECODE_SHAPES)."""
    from kernels.select import select_variant

    v = select_variant(replace_split(config, 1), mma=mma)
    if v.path in ("grouped", "mma"):
        units = config.g * config.num_heads_kv * -(-(config.gqa_ratio * config.seq_len_q) // v.block_m)
    else:
        units = config.g * config.num_heads_q * config.seq_len_q
    if blocks_per_sm is None:
        blocks_per_sm = v.blocks_per_sm or 4
    if tile_keys is None:
        tile_keys = v.tile_n if v.path == "mma" else 128
    key_tiles = -(-config.seq_len_k // tile_keys)
    saturating = num_sms * mma_saturating_blocks(v) if v.path == "mma" else None
    return num_splits_heuristic(units, num_sms * blocks_per_sm, key_tiles, max_splits, saturating=saturating)


def mma_saturating_blocks(v) -> int:
    """Blocks per SM of the mma variant `v` that stream at memory speed (above)."""
    return 1 if v.mma_decode and v.dqk_bucket + v.dv_bucket <= MMA_DECODE_STREAMING_DIMS else MMA_SATURATING_BLOCKS_PER_SM


def replace_split(config: AttentionConfig, split_kv: int) -> AttentionConfig:
    """`config` with another split count (return_lse follows: docs/spec.md §1 requires it above 1)."""
    return AttentionConfig(**{**config.model_dump(), "split_kv": split_kv,
                              "return_lse": config.return_lse or split_kv > 1})


def with_auto_split(config: AttentionConfig, num_sms: int, **kw) -> AttentionConfig:
    return replace_split(config, choose_split_kv(config, num_sms, **kw))


def resolve_split(raw: Mapping[str, Any], multiprocessors: int | None, *, mma: bool = False) -> dict[str, Any]:
    """A config's fields with `split_kv: 0` (automatic) replaced by the chosen count.

    0 is a library option, not a config value: sweeps sample explicit counts and results store
    the count that ran. Raises ValueError naming split_kv where no GPU says how many SMs it has."""
    if raw.get("split_kv") != 0:
        return dict(raw)
    if not multiprocessors:
        raise ValueError("split_kv: 0 (automatic) needs a GPU backend: the split count is sized to its multiprocessors")
    from attnconfig import parse_config

    one = parse_config({**raw, "split_kv": 1, "return_lse": bool(raw.get("return_lse"))})
    return with_auto_split(one, multiprocessors, mma=mma).model_dump()


