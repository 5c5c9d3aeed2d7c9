"""round_to equals numpy's/ml_dtypes' conversion, value for value."""
import ml_dtypes
import numpy as np
import pytest

from reference.rounding import round_to


def values(src):
    rng = np.random.default_rng(1)
    f16 = rng.integers(0, 0x7BFF, 20_000).astype(np.uint16).view(np.float16)
    above = np.nextafter(f16, np.float16(np.inf)).astype(np.float64)
    ties = (f16.astype(np.float64) + above) / 2  # exactly halfway: ties go to even
    parts = [
        rng.standard_normal(20_000) * 10.0 ** rng.integers(-12, 6, 20_000),
        np.exp(rng.standard_normal(20_000) * 3 - 12),  # softmax-like, mostly f16-subnormal
        ties, -ties,
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.9, 65520, 1e30, -1e30, 2.0**-24, 2.0**-25,
         3 * 2.0**-26, 2.0**-14, 1e-30],
    ]
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]).astype(src)


@pytest.mark.parametrize("src", [np.float32, np.float64])
@pytest.mark.parametrize("target", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_round_to_matches_astype(src, target):
    x = values(src)
    with np.errstate(all="ignore"):
        want = x.astype(target).astype(src)
    got = round_to(x, target)
    assert got.dtype == src
    np.testing.assert_array_equal(got, want)
    assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()


def test_round_to_in_place():
    x = values(np.float32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    round_to(x, np.float16, out=x)
    np.testing.assert_array_equal(x, want)
