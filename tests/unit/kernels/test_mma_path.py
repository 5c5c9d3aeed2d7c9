"""The tensor-core (mma) path: which configs take it, its variants and launch plan, and that
attention.hip's NVIDIA-only kernel compiles for sm_80 and sm_90 with nvcc where nvcc exists.

On a GPU it runs only on NVIDIA's (inline PTX: mma.sync, ldmatrix, cp.async); tests/gpu runs it
there against the reference, and test_mma_emulation.py on the host (host_emu.h emulates those
instructions). Compiling it here with nvcc catches what only NVIDIA's compiler sees, and
ptxas's report shows whether the variants keep their accumulators in registers.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from attnconfig import AttentionConfig
from kernels.autosplit import choose_split_kv
from kernels.backends.base import NotApplicable
from kernels.launch import (
    DEFAULT_MAX_SHARED,
    combine_launch,
    fuses_combine,
    fwd_blocks_x,
    fwd_launch,
    launch_plan,
)
from kernels.select import MMA_MAX_SHARED, Variant, mma_applies, select_variant
from kernels.source import SRC_DIR
from kernels.tuning import MMA_DECODE_SHAPES
from workers.enqueue import variant_key


def cfg(**kw) -> AttentionConfig:
    base = dict(dtype="f16", g=2, seq_len_q=1, seq_len_k=4096, num_heads_q=32, num_heads_kv=8,
                head_dim_qk=128, head_dim_v=128)
    base.update(kw)
    return AttentionConfig(**base)


def test_mma_takes_f16_bf16_with_contiguous_rows_and_dims_multiple_of_8():
    assert mma_applies(cfg()) and mma_applies(cfg(dtype="bf16", head_dim_qk=80, head_dim_v=256))
    for bad in (dict(dtype="f32"), dict(dtype="i8"), dict(head_dim_qk=300), dict(head_dim_v=36),
                dict(trans_q=True), dict(trans_k=True), dict(trans_v=True)):
        assert not mma_applies(cfg(**bad)), bad
    assert mma_applies(cfg(trans_o=True))     # O is written element by element


def test_auto_takes_mma_only_where_the_device_has_it():
    c = cfg()
    assert select_variant(c).path == "grouped"
    v = select_variant(c, mma=True)
    assert v.path == "mma"
    assert select_variant(cfg(trans_k=True), mma=True).path == "grouped"
    assert select_variant(cfg(dtype="f32"), mma=True).path == "grouped"
    assert select_variant(cfg(dtype="i8"), mma=True).path == "rowwise"
    assert select_variant(c, path="grouped", mma=True).path == "grouped"
    with pytest.raises(NotApplicable) as e:
        select_variant(c, path="mma")            # forced, but the device has no mma
    assert e.value.reason == "path_not_applicable"
    with pytest.raises(NotApplicable):
        select_variant(cfg(dtype="f32"), path="mma", mma=True)


def test_decode_splits_tiles_by_keys_and_prefill_by_rows():
    dec = select_variant(cfg(), mma=True)               # 4 rows per kv head
    _, tile_n, groups, minb = next(x for x in MMA_DECODE_SHAPES if 256 <= x[0])
    assert (dec.block_m, dec.threads, dec.tile_n, dec.key_groups, dec.min_blocks) == \
        (16, 32 * groups, tile_n, groups, minb)
    assert dec.fwd_expr == f"attn_splitkv_fwd_mma<__half, 128, 128, 32, {tile_n}, 1, {groups}, {minb}>"
    assert dec.name == f"attn_f16_qk128_v128_n32_m16_t{32 * groups}_k{tile_n}_b{minb}_mma"
    assert dec.blocks_per_sm == minb and groups > 1
    # a larger head dim falls in the next class of the table
    big = select_variant(cfg(dtype="bf16", head_dim_qk=256, head_dim_v=192), mma=True)
    assert (big.tile_n, big.key_groups) == MMA_DECODE_SHAPES[-1][1:3]
    pre = select_variant(cfg(seq_len_q=512, num_heads_q=4, num_heads_kv=4, seq_len_k=512), mma=True)
    assert (pre.block_m, pre.threads, pre.tile_n, pre.key_groups, pre.min_blocks) == (64, 128, 128, 1, 1)
    assert pre.fwd_expr == "attn_splitkv_fwd_mma<__half, 128, 128, 32, 128, 4, 1, 1>"
    # 17 rows per kv head no longer fit one row tile
    assert select_variant(cfg(seq_len_q=17, num_heads_q=8, num_heads_kv=8), mma=True).block_m == 64


@pytest.mark.parametrize("dqk, dv, tile_n, exp2", [(32, 32, 64, False), (64, 64, 128, True), (32, 64, 128, True),
                                                  (128, 128, 128, False), (64, 128, 128, False), (256, 256, 32, False)])
def test_prefill_tile_and_exponentials_follow_the_measured_table(dqk, dv, tile_n, exp2):
    pre = select_variant(cfg(seq_len_q=512, seq_len_k=512, head_dim_qk=dqk, head_dim_v=dv), mma=True)
    assert (pre.block_m, pre.tile_n, pre.mma_exp2) == (64, tile_n, exp2)
    assert ("-DATTN_MMA_EXP2=1" in pre.macro_options()) == exp2
    # decode keeps expf whatever its head dims
    assert not select_variant(cfg(head_dim_qk=dqk, head_dim_v=dv), mma=True).mma_exp2
    # and so does every kernel off the mma path
    assert not select_variant(cfg(seq_len_q=512, seq_len_k=512, head_dim_qk=dqk, head_dim_v=dv), path="grouped",
                              mma=True).mma_exp2


def test_prefill_takes_four_warps_of_one_row_tile_and_the_tables_key_tile():
    pre_cfg = cfg(seq_len_q=512, num_heads_q=4, num_heads_kv=4, seq_len_k=512)
    pre = select_variant(pre_cfg, mma=True)
    assert (pre.block_m, pre.threads, pre.row_warps, pre.key_groups, pre.tile_n) == (64, 128, 4, 1, 128)
    assert pre.name.endswith("_m64_t128_k128_b1_mma")
    assert pre.fwd_expr == "attn_splitkv_fwd_mma<__half, 128, 128, 32, 128, 4, 1, 1>"
    assert pre.shared_bytes == 128 * (136 + 136) * 2 <= MMA_MAX_SHARED
    assert fwd_blocks_x(pre_cfg, pre) == 2 * 4 * 512 // 64             # g = 2, 4 heads, 512 rows each
    # decode keeps its table; head dims past 256 together keep 32-key tiles
    assert select_variant(cfg(), mma=True).tile_n == next(x for x in MMA_DECODE_SHAPES if 256 <= x[0])[1]
    assert select_variant(cfg(seq_len_q=512, head_dim_qk=256, head_dim_v=256), mma=True).tile_n == 32


def test_exp2_softmax_is_a_compile_option_of_the_mma_path_only():
    d64, d128 = (cfg(seq_len_q=512, seq_len_k=512, head_dim_qk=d, head_dim_v=d) for d in (64, 128))
    assert "-DATTN_MMA_EXP2=1" in select_variant(d64, mma=True).macro_options()
    assert not any("EXP2" in m for m in select_variant(d128, mma=True).macro_options())
    assert not any("EXP2" in m for m in select_variant(cfg(dtype="f32"), mma=True).macro_options())
    assert not any("EXP2" in m for m in select_variant(d64, path="grouped", mma=True).macro_options())





def test_every_mma_variant_fits_the_shared_memory_every_mma_device_can_opt_in_to():
    # the decode tiles of D = 128 (128 keys) and D = 256 (64 keys) need the opt-in past 48 KB
    for d in (128, 256):
        v = select_variant(cfg(head_dim_qk=d, head_dim_v=d), mma=True)
        assert DEFAULT_MAX_SHARED < v.shared_bytes <= MMA_MAX_SHARED, v.name
    for dqk in (32, 64, 128, 256):
        for dv in (32, 64, 128, 256):
            for sq, hq in ((1, 8), (256, 8)):
                v = select_variant(cfg(head_dim_qk=dqk, head_dim_v=dv, seq_len_q=sq, num_heads_q=hq, num_heads_kv=8),
                                   mma=True)
                assert 0 < v.shared_bytes <= MMA_MAX_SHARED, v.name
    # room for one K and one V tile of padded rows (16 bytes more a row: ldmatrix's rows in other
    # banks); the swizzled rows of head dims 64, 128 and 256 use less of it
    v = Variant("f16", 128, 128, block_m=16, threads=128, tile_n=64, path="mma", min_blocks=3)
    assert v.shared_bytes == 64 * (136 + 136) * 2
    v = Variant("f16", 64, 32, block_m=16, threads=64, tile_n=32, path="mma", min_blocks=3)
    assert v.shared_bytes == 32 * (72 + 40) * 2
    # from DQK bucket 256 (MMA_Q_SMEM_FROM) the block's Q rows go there too, padded as K's
    v = Variant("f16", 256, 64, block_m=16, threads=128, tile_n=64, path="mma", min_blocks=2)
    assert v.shared_bytes == 64 * (264 + 72) * 2 + 16 * 264 * 2
    v = Variant("f16", 256, 256, block_m=64, threads=128, tile_n=32, path="mma", min_blocks=1)
    assert v.shared_bytes == 32 * (264 + 264) * 2 + 64 * 264 * 2


def test_launch_asks_for_the_variants_shared_memory():
    buf = {"q": 1, "k": 2, "v": 3, "o": 4, "lse": 5, "o_part": 6, "lse_part": 7}
    c = cfg(split_kv=8, return_lse=True)
    v = select_variant(c, mma=True)
    assert fwd_launch(c, v, buf).shared_bytes == v.shared_bytes > 0
    assert combine_launch(c, v, buf).shared_bytes == 0
    g = select_variant(c)
    assert fwd_launch(c, g, buf).shared_bytes == 0


def test_mma_decode_combines_in_the_split_kernel():
    buf = {"q": 1, "k": 2, "v": 3, "o": 4, "lse": 5, "o_part": 6, "lse_part": 7}
    c = cfg(split_kv=8, return_lse=True)
    v = select_variant(c, mma=True)
    assert fuses_combine(c, v)
    fused = launch_plan(c, v, {**buf, "combine_count": 9})
    assert [ln.kernel for ln in fused] == ["fwd"]
    args = [a.value for a in fused[0].args]
    assert args[4:6] == [4, 5] and args[-3:] == [9, None, 8]   # writes O and LSE; counts on 9; one group of 8
    two = launch_plan(c, v, buf)                           # no counter buffer: the combine kernel
    assert [ln.kernel for ln in two] == ["fwd", "combine"]
    assert [a.value for a in two[0].args][4:6] == [None, None] and two[0].args[-3].value is None
    assert fwd_blocks_x(c, v) == 2 * 8 == fused[0].grid[0]
    # many splits (a decode row's 256): the combine kernel by default; allowed, two levels, groups
    # of 16 and their partials in buffer 10
    many = cfg(split_kv=256, return_lse=True)
    assert not fuses_combine(many, v) and fuses_combine(many, v, max_splits=1024)
    plan = launch_plan(many, v, {**buf, "combine_count": 9, "combine_part": 10})
    assert [a.value for a in plan[0].args][-3:] == [9, 10, 16]
    assert not fuses_combine(cfg(split_kv=1), v)
    pre = cfg(seq_len_q=512, num_heads_q=4, num_heads_kv=4, seq_len_k=512, split_kv=2, return_lse=True)
    assert not fuses_combine(pre, select_variant(pre, mma=True))     # prefill row tiles
    g = cfg(split_kv=8, return_lse=True)
    assert not fuses_combine(g, select_variant(g))                   # the portable paths


def test_mma_launch_grid_packs_a_kv_heads_rows():
    buf = {"q": 1, "k": 2, "v": 3, "o": 4, "lse": 5, "o_part": 6, "lse_part": 7}
    c = cfg(split_kv=8, return_lse=True)
    f = fwd_launch(c, select_variant(c, mma=True), buf)
    assert f.grid == (2 * 8 * 1, 8, 1) and f.block == (128, 1, 1)
    p = cfg(seq_len_q=200, num_heads_q=8, num_heads_kv=2, seq_len_k=300)     # 800 rows per kv head
    assert fwd_launch(p, select_variant(p, mma=True), buf).grid == (2 * 2 * 13, 1, 1)


def test_autosplit_counts_the_mma_paths_blocks_and_tiles():
    from kernels.autosplit import num_splits_heuristic

    c = cfg(g=1, num_heads_q=8, num_heads_kv=1, seq_len_k=16384)   # one block per split
    # mma: the variant's blocks per SM and tiles; grouped: 528 slots (4 per SM), 128 tiles of 128
    v = select_variant(c, mma=True)
    assert choose_split_kv(c, 132, mma=True) == num_splits_heuristic(1, 132 * v.min_blocks, 16384 // v.tile_n)
    assert choose_split_kv(c, 132) == num_splits_heuristic(1, 528, 128) == 128
    assert choose_split_kv(cfg(g=64, seq_len_k=512), 132, mma=True) == 1


def test_enqueue_keys_separate_mma_from_grouped_configs():
    assert variant_key(cfg()) != variant_key(cfg(trans_k=True))
    assert variant_key(cfg()).endswith("_mma")


# ---- the source compiles (nvcc, where this machine has it) ---------------------------------
NVCC = shutil.which("nvcc")
INSTANCES = [
    select_variant(cfg(), mma=True),                                                     # decode
    select_variant(cfg(dtype="bf16", num_heads_q=8, num_heads_kv=8, seq_len_q=256), mma=True),   # prefill
    select_variant(cfg(head_dim_qk=256, head_dim_v=256), mma=True),
    select_variant(cfg(head_dim_qk=256, head_dim_v=256, num_heads_q=8, num_heads_kv=8, seq_len_q=256), mma=True),
    select_variant(cfg(dtype="bf16", head_dim_qk=40, head_dim_v=256, seq_len_q=64), mma=True),
    Variant("f16", 64, 64, block_m=16, threads=128, tile_n=64, path="mma", min_blocks=3,
            defects=("causal_off_by_one", "floor_blocks_per_split", "no_neginf_guard", "no_zero_sum_guard")),
]


@pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")
@pytest.mark.parametrize("arch, switches", [
    ("sm_80", []), ("sm_90", []),
    # the comparison builds: padded rows everywhere, no L2 fetch hint (docs/decisions.md)
    ("sm_90", ["-DATTN_MMA_SWIZZLE=0", "-DATTN_CP_L2_PREFETCH=0"]),
    # the FlashAttention 2 exponentials (on where MMA_PREFILL_TABLE says, prefill up to D = 64)
    ("sm_90", ["-DATTN_MMA_EXP2=1"]),
])
def test_mma_kernel_compiles_with_nvcc(tmp_path: Path, arch: str, switches: list[str]):
    # the combine kernels too (one per output type; variants share them)
    refs = "\n".join(f"    (void*)&{e}," for e in dict.fromkeys(e for v in INSTANCES for e in v.name_expressions))
    # the kernel's shared memory (AttnMmaSmem) is the host's Variant.shared_bytes, checked at compile time
    smem = "\n".join(f"static_assert(AttnMmaSmem<{v.dqk_bucket}, {v.dv_bucket}, {v.tile_n}, {v.row_warps}, "
                     f"{v.key_groups}>::bytes == {v.shared_bytes}, \"{v.name}\");" for v in INSTANCES)
    unit = tmp_path / "inst.cu"
    unit.write_text(f'#include "attention.hip"\n{smem}\nvoid* instances[] = {{\n{refs}\n}};\n')
    macros = sorted({m for v in INSTANCES for m in v.macro_options()})
    proc = subprocess.run([NVCC, f"-arch={arch}", "-cubin", "-std=c++17", f"-I{SRC_DIR}", "-Xptxas", "-v",
                           *macros, *switches, str(unit), "-o", str(tmp_path / "inst.cubin")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stderr
    compiled = re.findall(r"Compiling entry function '(\w+)'", report)
    assert len(compiled) == len({e for v in INSTANCES for e in v.name_expressions})
    # the f16 decode variant (D = 128): no spills under its blocks-per-SM register budget
    dec = INSTANCES[0]
    mangled = "attn_splitkv_fwd_mmaI6__half" + "".join(
        f"Li{n}E" for n in (128, 128, 32, dec.tile_n, 1, dec.key_groups, dec.min_blocks))
    stats = re.split(r"Compiling entry function ", report)[1:]
    decode = next(s for s in stats if mangled in s)
    assert "0 bytes spill stores" in decode
    regs = int(re.search(r"Used (\d+) registers", decode).group(1))
    assert regs * dec.threads * dec.min_blocks <= 65536


@pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")
def test_the_d256_kernels_spill_no_more_than_they_did(tmp_path: Path):
    """The D = 256 variants run at the register limit. Spills there cost: code after the decode
    kernel's main loop that made it spill 144 bytes instead of 128 made it 1.2x slower on an H100
    (docs/decisions.md, "Decode's fixed costs"). With Q's fragments read from shared memory
    (MMA_Q_SMEM_FROM) the decode kernel spills nothing (128 bytes with them in registers) and the
    prefill one 116 (420): the production build's spills must not grow."""
    wide = select_variant(cfg(head_dim_qk=256, head_dim_v=256), mma=True)
    assert (wide.dqk_bucket, wide.tile_n, wide.key_groups, wide.min_blocks) == (256, 64, 4, 2)
    pre = select_variant(cfg(head_dim_qk=256, head_dim_v=256, num_heads_q=8, num_heads_kv=8, seq_len_q=256), mma=True)
    assert (pre.block_m, pre.tile_n, pre.key_groups, pre.min_blocks) == (64, 32, 1, 1)
    unit = tmp_path / "wide.cu"
    unit.write_text(f'#include "attention.hip"\nvoid* instances[] = {{ (void*)&{wide.fwd_expr}, (void*)&{pre.fwd_expr} }};\n')
    proc = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-std=c++17", f"-I{SRC_DIR}", "-Xptxas", "-v",
                           *wide.macro_options(), str(unit), "-o", str(tmp_path / "wide.cubin")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = [s for s in re.split(r"Function properties for ", proc.stderr) if s.startswith("_Z20attn_splitkv_fwd_mma")]
    spills = {("decode" if "Li64ELi1ELi4ELi2E" in k else "prefill"): int(re.search(r"(\d+) bytes spill stores", k).group(1))
              for k in kernels}
    assert spills["decode"] == 0, f"the D = 256 decode kernel spills {spills['decode']} bytes (0 before)"
    assert spills["prefill"] <= 116, f"the D = 256 prefill kernel spills {spills['prefill']} bytes (116 before)"
