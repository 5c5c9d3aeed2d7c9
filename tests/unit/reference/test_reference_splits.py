"""Split-KV arithmetic (docs/spec.md §3): boundaries, valid splits, and the named cases of the bug history."""
import numpy as np
from hypothesis import given, settings, strategies as st

from attnconfig import parse_config
from reference import blocks_per_split, n_blocks, split_block_ranges, valid_splits
from reference.chunks import plan
from reference.masks import row_key_limits, visible


def cfg(**kw):
    base = dict(dtype="f32", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=1, num_heads_kv=1,
                head_dim_qk=4, head_dim_v=4, return_lse=True)
    return parse_config({**base, **kw})


def test_n_blocks_counts_blocks_holding_keys_0_to_L():
    assert n_blocks(0, 32) == 1
    assert n_blocks(31, 32) == 1
    assert n_blocks(32, 32) == 2
    assert n_blocks(383, 32) == 12


def test_blocks_per_split_is_a_ceiling():
    assert blocks_per_split(12, 5) == 3
    assert blocks_per_split(8, 16) == 1
    assert blocks_per_split(16, 8) == 2
    assert blocks_per_split(8, 16, floor=True) == 0  # the defect: zero iterations per split


def test_spec_example_one_key_two_splits():
    assert split_block_ranges(0, 32, 2) == [(0, 1), (1, 1)]


def test_spec_example_twelve_blocks_five_splits_last_split_empty():
    assert split_block_ranges(12 * 32 - 1, 32, 5) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 12)]


def test_sixteen_blocks_eight_splits_all_full():
    assert split_block_ranges(16 * 32 - 1, 32, 8) == [(2 * s, 2 * s + 2) for s in range(8)]


def test_fewer_blocks_than_splits_trailing_splits_empty():
    ranges = split_block_ranges(8 * 32 - 1, 32, 16)
    assert ranges[:8] == [(s, s + 1) for s in range(8)]
    assert all(start == end for start, end in ranges[8:])


def test_floor_defect_leaves_every_split_empty_when_blocks_fewer_than_splits():
    assert all(start == end for start, end in split_block_ranges(8 * 32 - 1, 32, 16, floor=True))


@given(last=st.integers(0, 5000), block_n=st.sampled_from([16, 32, 64, 128]), splits=st.integers(1, 128))
@settings(max_examples=200, deadline=None)
def test_split_ranges_tile_the_blocks_in_order(last, block_n, splits):
    ranges = split_block_ranges(last, block_n, splits)
    assert len(ranges) == splits
    covered = [b for start, end in ranges for b in range(start, end)]
    assert covered == list(range(n_blocks(last, block_n)))
    sizes = [end - start for start, end in ranges]
    # Non-empty splits come first, all of size blocks_per_split except possibly the last one.
    non_empty = [s for s in sizes if s]
    assert sizes[:len(non_empty)] == non_empty
    assert all(s == blocks_per_split(n_blocks(last, block_n), splits) for s in non_empty[:-1])


def test_valid_splits_non_causal_one_count_per_batch():
    c = cfg(g=3, seq_len_q=2, num_heads_q=2, seq_len_k=400, current_seq_len=[0, 100, 399], split_kv=4)
    v = valid_splits(c, 32)
    assert v.shape == (3, 2, 2)
    # L=0: 1 block -> 1 valid; L=100: 4 blocks, 1 per split -> 4; L=399: 13 blocks, 4 per split -> 4.
    assert (v[0] == 1).all() and (v[1] == 4).all() and (v[2] == 4).all()


def test_valid_splits_causal_per_row():
    c = cfg(seq_len_q=200, seq_len_k=256, causal=True, split_kv=4)
    v = valid_splits(c, 32)  # 8 blocks, 2 per split = 64 keys per split
    assert v[0, 0, 0] == 1 and v[0, 0, 63] == 1 and v[0, 0, 64] == 2
    assert v[0, 0, 191] == 3 and v[0, 0, 192] == 4 and v[0, 0, 199] == 4


def test_valid_splits_prefix_offset_past_the_end_sees_every_split():
    c = cfg(seq_len_q=4, seq_len_k=256, causal=True, prefix_offset=[10_000], split_kv=4)
    assert (valid_splits(c, 32) == 4).all()


def test_valid_splits_agree_with_visibility_brute_force():
    c = cfg(g=2, seq_len_q=50, seq_len_k=300, causal=True, prefix_offset=[3, 120], current_seq_len=[200, 77], split_kv=6)
    v = valid_splits(c, 16)
    for b in range(2):
        vis = visible(c, b)
        ranges = split_block_ranges(c.last_valid_key(b), 16, 6)
        for q in range(50):
            sees = [vis[q, s0 * 16:s1 * 16].any() for s0, s1 in ranges]
            assert v[b, 0, q] == sum(sees)
            assert sees == [True] * sum(sees) + [False] * (6 - sum(sees))


def test_row_key_limits_and_off_by_one_shift():
    c = cfg(seq_len_q=3, seq_len_k=10, causal=True, prefix_offset=[2], current_seq_len=[3])
    np.testing.assert_array_equal(row_key_limits(c), [[2, 3, 3]])
    np.testing.assert_array_equal(row_key_limits(c, causal_shift=-1), [[1, 2, 3]])
    np.testing.assert_array_equal(visible(c, 0)[0], [True, True, True] + [False] * 7)


@given(g=st.integers(1, 5), hkv=st.integers(1, 4), sq=st.integers(1, 40), unit=st.integers(1, 500),
       head=st.integers(0, 3000), budget=st.integers(1, 4000))
@settings(max_examples=100, deadline=None)
def test_plan_covers_every_unit_exactly_once(g, hkv, sq, unit, head, budget):
    seen = np.zeros((g, hkv, sq), dtype=int)
    for p in plan([(0, 2), (2, g)] if g > 2 else [(0, g)], hkv, sq, unit, head, budget):
        seen[p.batches, p.kv_heads, p.rows] += 1
        bc, hc, qc = p.shape
        if bc * (hc * qc * unit + hc * head) > budget:  # over budget only as one head's row block
            assert bc == hc == 1 and (qc == 1 or qc * unit <= budget)
            assert qc == sq or sq * unit + head > budget
    assert (seen == 1).all()
