"""kernels/pinned.py's pool, with the C library's malloc standing in for cuMemHostAlloc: a
block returns to the pool only when every array and view on it is gone, and the pool holds
no more than its limit."""
import ctypes
import gc

import numpy as np
import pytest

from attnconfig import parse_config
from kernels.pinned import PinnedPool, is_pinned
from reference import make_inputs

MB = 1 << 20


class Libc:
    def __init__(self):
        self.libc = ctypes.CDLL(None)
        self.libc.malloc.restype = ctypes.c_void_p
        self.libc.malloc.argtypes = [ctypes.c_size_t]
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.allocated, self.freed = [], []

    def alloc(self, nbytes):
        ptr = self.libc.malloc(nbytes)
        self.allocated.append((ptr, nbytes))
        return ptr

    def free(self, ptr):
        self.freed.append(ptr)
        self.libc.free(ptr)


@pytest.fixture
def mem():
    return Libc()


def test_a_block_comes_back_only_when_its_last_view_is_gone(mem):
    pool = PinnedPool(mem.alloc, mem.free, limit=64 * MB)
    a = pool.empty((512, 1024), np.float32)          # 2 MB
    assert is_pinned(a) and a.flags.c_contiguous and a.flags.writeable
    a[...] = 7
    views = [a.T, a.reshape(-1)[::3], a[10:20]]
    assert all(is_pinned(v) for v in views)
    ptr = a.ctypes.data
    del a
    gc.collect()
    assert pool.idle_bytes() == 0                    # the views still hold it
    b = pool.empty((512, 1024), np.float32)
    assert b.ctypes.data != ptr                      # not handed out twice
    assert float(views[2].sum()) == 7 * 10 * 1024     # and not overwritten
    del views
    gc.collect()
    assert pool.idle_bytes() == 2 * MB
    c = pool.empty((1000, 1000), np.float16)         # same size class (2 MB): the same block
    assert c.ctypes.data == ptr
    assert len(mem.allocated) == 2 and pool.held == 4 * MB


def test_small_and_oversized_arrays_are_plain_numpy_memory(mem):
    pool = PinnedPool(mem.alloc, mem.free, limit=8 * MB)
    small = pool.empty((100,), np.float64)
    big = pool.empty((3 * MB,), np.float32)          # 12 MB > limit
    assert not is_pinned(small) and not is_pinned(big)
    assert mem.allocated == []
    assert small.shape == (100,) and big.dtype == np.float32


def test_the_limit_trims_idle_blocks_then_falls_back(mem):
    pool = PinnedPool(mem.alloc, mem.free, limit=8 * MB)
    a = pool.empty((4 * MB,), np.uint8)
    b = pool.empty((2 * MB,), np.uint8)
    assert pool.held == 6 * MB
    c = pool.empty((4 * MB,), np.uint8)              # 6 + 4 > 8 and nothing idle: numpy memory
    assert not is_pinned(c)
    del a
    gc.collect()
    d = pool.empty((3 * MB,), np.uint8)              # the idle 4 MB block, reused
    assert is_pinned(d) and pool.held == 6 * MB and mem.freed == []
    del d
    gc.collect()
    e = pool.empty((8 * MB,), np.uint8)              # needs the idle 4 MB freed; b still leased
    assert not is_pinned(e) and len(mem.freed) == 1 and pool.held == 2 * MB
    del b
    gc.collect()
    f = pool.empty((8 * MB,), np.uint8)
    assert is_pinned(f) and pool.held == 8 * MB and len(mem.freed) == 2


def test_close_frees_idle_blocks_at_once_and_leased_ones_when_released(mem):
    pool = PinnedPool(mem.alloc, mem.free, limit=16 * MB)
    a, b = pool.empty((MB,), np.uint8), pool.empty((2 * MB,), np.uint8)
    del a
    gc.collect()
    pool.close()
    assert len(mem.freed) == 1 and pool.held == 2 * MB
    assert not is_pinned(pool.empty((2 * MB,), np.uint8))   # a closed pool hands out nothing
    del b
    gc.collect()
    assert len(mem.freed) == 2 and pool.held == 0


def test_inputs_drawn_into_the_pool_are_the_same_bytes(mem):
    pool = PinnedPool(mem.alloc, mem.free, limit=64 * MB)
    for dtype in ("f16", "bf16", "f32", "i8"):
        c = parse_config(dict(dtype=dtype, g=2, seq_len_q=1, seq_len_k=4096, num_heads_q=8, num_heads_kv=2,
                              head_dim_qk=128, head_dim_v=64, with_attn_bias=True, data_seed=11))
        plain, pinned = make_inputs(c), make_inputs(c, empty=pool.empty)
        assert set(plain) == set(pinned)
        assert is_pinned(pinned["v"]) and is_pinned(pinned["k"]) == (dtype != "i8")   # i8 K: rng.integers' own
        assert not is_pinned(pinned["bias"])                                             # 128 KB: under MIN_BYTES
        for name, value in plain.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == pinned[name].dtype and value.shape == pinned[name].shape
                np.testing.assert_array_equal(value.view(np.uint8), pinned[name].view(np.uint8))
            else:
                assert value == pinned[name]
