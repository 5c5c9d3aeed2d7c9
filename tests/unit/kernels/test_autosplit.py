"""The automatic split count: FlashAttention's wave-efficiency rule, with our efficiency share."""
import pytest

from attnconfig import parse_config
from kernels.autosplit import choose_split_kv, num_splits_heuristic, replace_split, resolve_split, with_auto_split

H200_SMS = 132


def decode(b, hq, hkv, sk, d, dtype="f16"):
    return parse_config(dict(dtype=dtype, g=b, seq_len_q=1, seq_len_k=sk, num_heads_q=hq, num_heads_kv=hkv,
                             head_dim_qk=d, head_dim_v=d, split_kv=1, return_lse=False))


@pytest.mark.parametrize("shape, splits", [
    ((1, 32, 8, 131072, 128), 64),   # 8 blocks per split: 64 fill 512 of 528 slots
    ((8, 32, 8, 32768, 128), 8),     # FlashAttention's 85% would stop at 7 (448 of 528)
    ((8, 32, 8, 4096, 128), 8),
    ((16, 64, 8, 8192, 128), 2),     # 256 blocks per split
    ((4, 32, 32, 16384, 128), 4),    # no GQA: one row per block, 128 blocks per split
    ((1, 8, 1, 65536, 128), 128),    # one block per split: as many as allowed (FlashAttention's cap)
    ((32, 32, 8, 2048, 64), 2),
])
def test_decode_shapes_of_the_benchmark_on_an_h200(shape, splits):
    assert choose_split_kv(decode(*shape), H200_SMS) == splits


def test_flashattention_rule_is_kept_as_an_option_and_differs_where_measured():
    # 64 units, 528 slots: s=7 is 85% efficient, s=8 97%: FlashAttention takes the smaller.
    assert num_splits_heuristic(64, 528, 256, share=0.85, count_tiles=False) == 7
    assert num_splits_heuristic(64, 528, 256) == 8


def test_the_last_part_empty_tile_counts():
    # 8 units, 1024 tiles: 61 splits (17 tiles each) fill the wave about as well as 64 (16 each)
    # by waves alone; counting tiles, 64 is the one that is 97% efficient.
    assert num_splits_heuristic(8, 528, 1024, count_tiles=False) == 61
    assert num_splits_heuristic(8, 528, 1024) == 64


def test_at_most_128_splits_as_flashattention():
    # one block per split and 1024 tiles: the wave rule alone would take 512 splits of 2 tiles
    assert num_splits_heuristic(units=1, slots=528, key_tiles=1024) == 128
    assert num_splits_heuristic(units=1, slots=528, key_tiles=1024, max_splits=528) == 512
    assert choose_split_kv(decode(1, 8, 1, 65536, 128), H200_SMS, mma=True) == 128


def test_enough_blocks_without_splitting_means_one_split():
    assert num_splits_heuristic(units=430, slots=528, key_tiles=1000) == 1
    assert choose_split_kv(decode(64, 64, 8, 8192, 128), H200_SMS) == 1


def test_never_more_splits_than_key_tiles_and_only_counts_that_change_the_split_size():
    # 3 tiles of keys: 2 and 3 splits give 2 and 1 tiles each; nothing beyond 3.
    assert num_splits_heuristic(units=1, slots=528, key_tiles=3) == 3
    for tiles in (5, 17, 100):
        s = num_splits_heuristic(units=2, slots=528, key_tiles=tiles)
        assert 1 <= s <= tiles
        assert s == 1 or -(-tiles // s) != -(-tiles // (s - 1))


def test_with_auto_split_turns_on_lse_for_the_combine():
    c = with_auto_split(decode(1, 8, 1, 65536, 128), H200_SMS)
    assert c.split_kv == 128 and c.return_lse
    assert replace_split(c, 1).return_lse  # kept once asked for


def test_split_kv_zero_is_resolved_to_the_automatic_count_and_others_are_kept():
    raw = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=65536, num_heads_q=8, num_heads_kv=1,
               head_dim_qk=128, head_dim_v=128, split_kv=0)
    resolved = resolve_split(raw, H200_SMS)
    assert resolved["split_kv"] == 128 and resolved["return_lse"] is True
    assert parse_config(resolved).split_kv == 128
    assert resolve_split({**raw, "split_kv": 4, "return_lse": True}, H200_SMS)["split_kv"] == 4
    assert resolve_split({**raw, "split_kv": 4, "return_lse": True}, None)["split_kv"] == 4


def test_split_kv_zero_without_a_gpu_names_the_field():
    with pytest.raises(ValueError, match=r"split_kv: 0 \(automatic\) needs a GPU backend"):
        resolve_split({"split_kv": 0}, None)


def test_mma_decode_does_not_split_blocks_that_already_fill_two_per_sm():
    # 256 blocks of 2048 keys (32 x 8 kv heads): 2 per SM stream at memory speed on the mma
    # path, so no split; the grouped path (4 per SM, 528 slots) still splits them.
    c = decode(32, 32, 8, 2048, 64)
    assert choose_split_kv(c, H200_SMS, mma=True) == 1
    assert choose_split_kv(c, H200_SMS) == 2
    # below 80% of that the wave rule decides, as before
    assert choose_split_kv(decode(26, 32, 8, 2048, 256), H200_SMS, mma=True) > 1    # 208 blocks (D = 256)
    assert choose_split_kv(decode(8, 32, 8, 32768, 256), H200_SMS, mma=True) == 4   # 64 blocks (D = 256)


def test_mma_decode_up_to_head_dim_128_streams_at_one_block_per_sm():
    # 128 blocks: no split up to D = 128 (one per SM streams as fast), 2 at D = 256 (two per SM)
    assert choose_split_kv(decode(16, 64, 8, 8192, 128), H200_SMS, mma=True) == 1
    assert choose_split_kv(decode(4, 32, 32, 16384, 128), H200_SMS, mma=True) == 1
    assert choose_split_kv(decode(16, 64, 8, 8192, 256), H200_SMS, mma=True) > 1
    # 13 x 8 = 104 blocks, below 80% of one per SM (105.6): split
    assert choose_split_kv(decode(13, 64, 8, 8192, 128), H200_SMS, mma=True) > 1
    # prefill's mma variant (four row tiles, no key groups) keeps two per SM: 110 blocks split
    pre = parse_config(dict(dtype="f16", g=1, seq_len_q=64, seq_len_k=8192, num_heads_q=110, num_heads_kv=110,
                            head_dim_qk=128, head_dim_v=128, split_kv=1, return_lse=False))
    assert choose_split_kv(pre, H200_SMS, mma=True) > 1
    assert choose_split_kv(decode(110, 8, 1, 8192, 128), H200_SMS, mma=True) == 1   # 110 decode blocks: not
    assert num_splits_heuristic(200, 396, 32, saturating=264) > 1
    assert num_splits_heuristic(212, 396, 32, saturating=264) == 1
