"""The compiled normal draws (reference/normals.py) are numpy's Generator.standard_normal, cast once to
the storage type, bit for bit, and leave the generator where numpy's draw leaves it; numpy draws
them where the loop cannot be built."""
import ml_dtypes
import numpy as np
import pytest

import reference.normals as normals
from reference.normals import draw_normals, narrow
from reference.rounding import narrow_f64
from tests.unit.reference.test_host_fastpaths import bits, narrow_hard_values

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.fixture
def compiled():
    lib = normals.native()
    if lib is None:
        pytest.skip("no C compiler or no libnpyrandom.a here: numpy draws (tested below)")
    return lib


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """native() built again in a folder of the test's own, under the environment the test sets."""
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(tmp_path))
    normals.native.cache_clear()
    yield
    normals.native.cache_clear()


def numpy_draw(seed, n, dtype):
    rng = np.random.default_rng(seed)
    return narrow_f64(rng.standard_normal(n), np.empty(n, dtype)), rng


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [0, 1, 977, 300_001])
def test_draws_are_numpys_and_leave_the_stream_where_numpy_does(compiled, dtype, n):
    for seed in (0, 123456789, 2**31 - 1):
        want, numpy_rng = numpy_draw(seed, n, dtype)
        rng = np.random.default_rng(seed)
        got = draw_normals(rng, np.empty(n, dtype))
        np.testing.assert_array_equal(bits(got), bits(want))
        assert rng.bit_generator.state == numpy_rng.bit_generator.state
        assert rng.standard_normal(3).tolist() == numpy_rng.standard_normal(3).tolist()


def test_tail_and_wedge_draws_are_numpys(compiled):
    # 4M draws: about a thousand from the tail beyond 3.65 and 40,000 from the wedges, which the
    # loop hands to numpy's own function mid-stream.
    want, _ = numpy_draw(99, 1 << 22, np.float64)
    got = draw_normals(np.random.default_rng(99), np.empty(1 << 22))
    assert (np.abs(want) > 3.65).sum() > 500
    np.testing.assert_array_equal(bits(got), bits(want))


def test_a_buffered_32_bit_half_survives_the_draw(compiled):
    # make_inputs' i8 order: int8 draws (32-bit halves, one left buffered after an odd count),
    # normals, then an integer that takes the buffered half.
    def sequence(draw):
        rng = np.random.default_rng(5)
        q = rng.integers(-8, 7, size=7, endpoint=True, dtype=np.int8)
        v = draw(rng)
        return q.tobytes(), bits(v).tobytes(), int(rng.integers(-4, 4, endpoint=True)), rng.integers(0, 1 << 30, 5).tolist()

    assert sequence(lambda rng: draw_normals(rng, np.empty(1001, np.float16))) == \
        sequence(lambda rng: rng.standard_normal(1001).astype(np.float16))


def test_narrow_is_narrow_f64(compiled):
    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = narrow_hard_values(dtype)
        np.testing.assert_array_equal(bits(narrow(x, np.empty(x.shape, dtype))), bits(x.astype(dtype)))
    x = narrow_hard_values(np.float16) * 2.0 ** np.arange(-160, 160, 16).repeat(1)[:, None]
    x = x.reshape(-1)
    for dtype in (np.float32, np.float64, ml_dtypes.bfloat16):   # subnormals, overflow to inf
        with np.errstate(over="ignore"):
            want = narrow_f64(x, np.empty(x.shape, dtype))
        np.testing.assert_array_equal(bits(narrow(x, np.empty(x.shape, dtype))), bits(want))


@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan])
def test_narrow_of_a_non_finite_value_is_the_cast(special):
    x = np.random.default_rng(1).standard_normal(5000)
    x[1234] = special
    with np.errstate(all="ignore"):
        for dtype in (np.float16, ml_dtypes.bfloat16):
            np.testing.assert_array_equal(bits(narrow(x, np.empty(x.shape, dtype))), bits(x.astype(dtype)))


def test_other_bit_generators_draw_through_numpy(compiled):
    rng, numpy_rng = (np.random.Generator(np.random.Philox(3)) for _ in range(2))
    got = draw_normals(rng, np.empty(1000, np.float16))
    np.testing.assert_array_equal(bits(got), bits(numpy_rng.standard_normal(1000).astype(np.float16)))


@pytest.mark.parametrize("how", ["switched off", "no compiler"])
def test_without_the_loop_numpy_draws_the_same_bytes(fresh_native, monkeypatch, how):
    if how == "switched off":
        monkeypatch.setenv("ATTNSWEEP_NATIVE_NORMALS", "0")
    else:
        monkeypatch.setenv("CC", "no-such-compiler")
        monkeypatch.setenv("PATH", "")
    assert normals.native() is None
    for dtype in DTYPES:
        want, numpy_rng = numpy_draw(11, 200_003, dtype)   # several of the fallback's chunks
        rng = np.random.default_rng(11)
        np.testing.assert_array_equal(bits(draw_normals(rng, np.empty(200_003, dtype))), bits(want))
        assert rng.bit_generator.state == numpy_rng.bit_generator.state


def test_the_loop_is_built_once_and_checked(fresh_native, tmp_path):
    if normals._compiler() is None or normals._numpy_parts() is None:
        pytest.skip("no C compiler or no libnpyrandom.a here")
    assert normals.native() is not None
    built = list((tmp_path / "host").glob("normals-*.so"))
    assert len(built) == 1
    normals.native.cache_clear()
    assert normals.native() is not None   # loaded from the folder
    assert list((tmp_path / "host").glob("normals-*.so")) == built


def test_a_dtype_it_does_not_fill_is_refused_naming_it():
    with pytest.raises(ValueError, match="int8"):
        draw_normals(np.random.default_rng(0), np.empty(4, np.int8))
    with pytest.raises(ValueError, match="contiguous"):
        draw_normals(np.random.default_rng(0), np.empty((4, 4), np.float32)[:, ::2])
