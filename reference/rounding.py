"""Rounding float arrays to a storage type's values while keeping them in f32/f64.

numpy converts to float16 in software, about 60 ns per element when the result is subnormal,
and softmax probabilities mostly are: rounding P through astype made the low-precision
reference 5-20x slower than the rest of it. Adding and subtracting a power of two rounds to
the same values (IEEE round-to-nearest-even) in a few vector passes.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

_F16_MANTISSA = 10
_F16_MIN_EXP = -14   # smallest normal exponent; below it the spacing stays 2^-24
_F16_MAX = 65504.0
_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def round_to(x: np.ndarray, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """x (f32 or f64) rounded to the nearest value of `dtype` (ties to even), in x's type.

    Equals x.astype(dtype).astype(x.dtype) for float16, bfloat16, float32 and float64.
    """
    dtype = np.dtype(dtype)
    if out is None:
        out = np.empty_like(x)
    if dtype == np.float16:
        return _round_f16(x, out)
    if dtype == np.dtype(ml_dtypes.bfloat16) or dtype.itemsize < x.dtype.itemsize:
        out[...] = x.astype(dtype)
        return out
    out[...] = x  # a wider or equal type holds x exactly
    return out


def _round_f16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    info = np.finfo(x.dtype)
    uint = _UINT[x.dtype]
    mantissa = info.nmant
    shift = mantissa - _F16_MANTISSA
    exponent_mask = uint(((1 << info.nexp) - 1) << mantissa)
    magnitude = np.abs(x)
    # M = 2^(e + shift) for |x| in [2^e, 2^(e+1)): |x| + M has the f16 spacing 2^(e-10) as its
    # ulp, so the addition rounds |x| to f16 precision. Subnormal f16 spacing is fixed at
    # 2^-24, hence the floor on M; the cap keeps huge |x| (overflow to inf below) finite.
    bits = (magnitude.view(uint) & exponent_mask) + uint(shift << mantissa)
    floor_bits = np.array(2.0 ** (_F16_MIN_EXP - _F16_MANTISSA + mantissa), dtype=x.dtype).view(uint)
    cap_bits = np.array(2.0 ** (16 + shift), dtype=x.dtype).view(uint)
    np.clip(bits, floor_bits, cap_bits, out=bits)
    magic = bits.view(x.dtype)
    nonfinite = ~np.isfinite(x)
    with np.errstate(invalid="ignore", over="ignore"):
        rounded = magnitude + magic  # fresh: out may be x itself
        rounded -= magic
        rounded[rounded > _F16_MAX] = np.inf
        if nonfinite.any():
            rounded[nonfinite] = magnitude[nonfinite]  # inf stays inf, NaN stays NaN
        np.copysign(rounded, x, out=out)
    return out


_BF16 = np.dtype(ml_dtypes.bfloat16)
# float32 bits below bfloat16's precision, and their value at a halfway point between two
# bfloat16 values (subnormals included: both types share the exponent field).
_BF16_LOW_BITS, _BF16_TIE_BITS = np.uint32(0xFFFF), np.uint32(0x8000)


def narrow_f64(x: np.ndarray, out: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """out[...] = x for a 1-d float64 x, bit for bit; faster for a bfloat16 out.

    ml_dtypes converts float64 to bfloat16 one element at a time (about 8 ns each, as long as
    drawing a normal); float64 -> float32 is a vector instruction. Going through float32
    rounds twice, which differs from one rounding only when the float32 lands exactly on a
    halfway point between bfloat16 values: every such point is a float32 and rounding is
    monotonic, so otherwise x and its float32 lie strictly on the same side of every halfway
    point and round alike. Those few elements (about one in 2^16) and non-finite ones are
    converted directly. float16 and float32 outs are plain casts: numpy's float32 -> float16
    is no faster than its float64 -> float16 (measured), so the same trick gains nothing.
    `scratch`: a float32 buffer of x's size, reused across calls.
    """
    if out.dtype != _BF16:
        out[...] = x
        return out
    t = scratch if scratch is not None else np.empty(x.shape, dtype=np.float32)
    with np.errstate(over="ignore"):
        t[...] = x
    direct = (t.view(np.uint32) & _BF16_LOW_BITS) == _BF16_TIE_BITS
    direct |= ~np.isfinite(t)
    out[...] = t
    if direct.any():
        where = np.flatnonzero(direct)
        out[where] = x[where]
    return out
