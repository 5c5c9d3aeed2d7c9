"""Rounding float arrays to a storage type's values while keeping them in f32/f64.

numpy converts to float16 in software, about 60 ns per element when the result is subnormal,
and softmax probabilities mostly are: rounding P through astype made the low-precision
reference 5-20x slower than the rest of it. Adding and subtracting a power of two rounds to
the same values (IEEE round-to-nearest-even) in a few vector passes.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from reference.chunks import Workspace

_F16_MANTISSA = 10
_F16_MIN_EXP = -14   # smallest normal exponent; below it the spacing stays 2^-24
_F16_MAX = 65504.0
_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
# Below this every float32 rounds to a finite float16 (65520 is the tie between 65504 and 2^16).
_F16_OVERFLOW = 65520.0
# float32 constants of _round_f16: exponent field, the shift of the exponent by 23 - 10 mantissa
# bits, and the bits of M's floor 2^(-14 - 10 + 13) (float16's subnormal spacing 2^-24 as an ulp).
_F32_EXPONENT_MASK, _F32_SIGN = np.uint32(0x7F800000), np.uint32(0x80000000)
_F32_F16_SHIFT = np.uint32((23 - _F16_MANTISSA) << 23)
_F32_F16_FLOOR = np.array(2.0 ** (_F16_MIN_EXP - _F16_MANTISSA + 23), dtype=np.float32).view(np.uint32)
_ROUND_CHUNK = 1 << 16  # float32 elements a pass of _round_f16 covers at a time (256 KiB)


def round_to(x: np.ndarray, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """x (f32 or f64) rounded to the nearest value of `dtype` (ties to even), in x's type.

    Equals x.astype(dtype).astype(x.dtype) for float16, bfloat16, float32 and float64.
    """
    dtype = np.dtype(dtype)
    if out is None:
        out = np.empty_like(x)
    if dtype == np.float16:
        return _round_f16(x, out)
    if dtype == _BF16 and x.dtype == np.float64:
        # Through narrow_f64, not ml_dtypes' float64 cast: some of its versions round twice.
        flat = np.ascontiguousarray(x).reshape(-1)
        out[...] = narrow_f64(flat, np.empty(flat.shape, dtype)).reshape(x.shape)
        return out
    if dtype == _BF16 or dtype.itemsize < x.dtype.itemsize:
        out[...] = x.astype(dtype)
        return out
    out[...] = x  # a wider or equal type holds x exactly
    return out


def _round_f16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    if x.dtype == np.float32 and out.dtype == np.float32 and x.size:
        if x.size > _ROUND_CHUNK and x.flags.c_contiguous and out.flags.c_contiguous:
            # A chunk at a time with reused scratch: a whole-array temporary per pass costs its
            # page faults on every call (three of 300 MB for a large attention output).
            flat_x, flat_out, work = x.reshape(-1), out.reshape(-1), Workspace()
            for i in range(0, flat_x.size, _ROUND_CHUNK):
                _round_f16_part(flat_x[i:i + _ROUND_CHUNK], flat_out[i:i + _ROUND_CHUNK], work)
            return out
        return _round_f16_part(x, out, None)
    return _round_f16_any(x, out)


def _round_f16_part(x: np.ndarray, out: np.ndarray, work: Workspace | None) -> np.ndarray:
    """_round_f16 of float32 x (rounding is elementwise: any cut gives the same bits); work: its
    scratch, or None for fresh temporaries (cheaper for a small x)."""
    magnitude = np.abs(x) if work is None else np.abs(x, out=work.take("magnitude", x.shape, np.float32))
    # NaN and inf fail the test too: only then are the overflow and non-finite passes of the
    # general path needed (softmax probabilities and attention outputs never take them).
    if float(magnitude.max()) < _F16_OVERFLOW:
        return _round_f16_finite(x, magnitude, out, work)
    return _round_f16_any(x, out)


def _round_f16_any(x: np.ndarray, out: np.ndarray) -> np.ndarray:
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


def _round_f16_finite(x: np.ndarray, magnitude: np.ndarray, out: np.ndarray, work: Workspace | None) -> np.ndarray:
    """_round_f16 of a float32 x whose magnitudes (given, and overwritten) are all below 65520.

    The same additions as the general path, without the cap on M (|x| < 2^16 never reaches it)
    and without the overflow and non-finite passes: the same bits in half the passes. The sign
    goes back as a bit (copysign of a non-negative magnitude, at a third of copysign's cost).
    """
    # The sign before out, which may be x, is written.
    def scratch(name):
        return None if work is None else work.take(name, x.shape, np.uint32)
    sign = np.bitwise_and(x.view(np.uint32), _F32_SIGN, out=scratch("sign"))
    magic_bits = np.bitwise_and(magnitude.view(np.uint32), _F32_EXPONENT_MASK, out=scratch("magic"))
    magic_bits += _F32_F16_SHIFT
    np.maximum(magic_bits, _F32_F16_FLOOR, out=magic_bits)
    magic = magic_bits.view(np.float32)
    magnitude += magic
    magnitude -= magic
    np.bitwise_or(magnitude.view(np.uint32), sign, out=out.view(np.uint32))
    return out


_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
# float32 bits below bfloat16's precision, and their value at a halfway point between two
# bfloat16 values (subnormals included: both types share the exponent field).
_BF16_LOW_BITS, _BF16_TIE_BITS = np.uint32(0xFFFF), np.uint32(0x8000)
# The same for float16, in a float32 scaled by 2^-112 (_narrow_f16).
_F16_LOW_BITS, _F16_TIE_BITS = np.uint32(0x1FFF), np.uint32(0x1000)
_F16_SCALE = np.float32(2.0 ** -112)
_F16_INF_BITS = np.uint32(0x7C00)


def narrow_f64(x: np.ndarray, out: np.ndarray, scratch: np.ndarray | None = None,
               work: Workspace | None = None) -> np.ndarray:
    """out[...] = x for a 1-d float64 x, bit for bit; faster for a bfloat16 or float16 out.

    ml_dtypes converts float64 to bfloat16 one element at a time (about 8 ns each, as long as
    drawing a normal), numpy float64 to float16 in software (2.2 ns); float64 -> float32 is a
    vector instruction. Going through float32 rounds twice, which differs from one rounding
    only when the float32 lands exactly on a halfway point between values of the narrow type:
    every such point is a float32 and rounding is monotonic, so otherwise x and its float32
    lie strictly on the same side of every halfway point and round alike. Those few elements
    (about one in 2^13 for float16, 2^16 for bfloat16) and non-finite ones are converted
    directly; the rest are rounded from the float32 bits with integer operations
    (round-to-nearest-even at the narrow type's last bit). `scratch`: a float32 buffer of x's
    size, `work` a chunks.Workspace for two more, reused across calls (a fresh temporary of a
    chunk's size costs its page faults again whenever the allocator trims its heap).
    """
    if out.dtype not in (_BF16, _F16):
        out[...] = x
        return out
    work = work if work is not None else Workspace()
    t = scratch if scratch is not None else work.take("narrow_f32", x.shape, np.float32)
    bits = t.view(np.uint32)
    tmp = work.take("narrow_u32", x.shape, np.uint32)
    direct = work.take("narrow_direct", x.shape, np.bool_)
    with np.errstate(over="ignore"):
        t[...] = x
    if out.dtype == _BF16:
        np.bitwise_and(bits, _BF16_LOW_BITS, out=tmp)
        np.equal(tmp, _BF16_TIE_BITS, out=direct)
        finite = np.isfinite(t, out=work.take("narrow_finite", x.shape, np.bool_))
        direct &= finite   # a NaN's payload can look like a halfway point
        # A finite float32 beyond bfloat16's largest value carries into the exponent: inf, as
        # the cast gives.
        out.view(np.uint16)[...] = _round_bits(bits, 16, tmp)
        _round_bf16_ties_once(x, t, out, direct)
        return _fix_direct(x, out, np.logical_not(finite, out=finite))
    # Scaled by 2^-112, float16's normals become float32 normals and its subnormals float32
    # subnormals with float16's bits in bits 13..30: one integer rounding for both. The
    # scaling rounds tiny values to float32's subnormal grid, a third rounding whose halfway
    # points at float16's last bit the same check catches.
    np.multiply(t, _F16_SCALE, out=t)
    np.bitwise_and(bits, _F16_LOW_BITS, out=tmp)
    np.equal(tmp, _F16_TIE_BITS, out=direct)
    sign = np.right_shift(bits, 16, out=work.take("narrow_sign", x.shape, np.uint32))
    sign &= np.uint32(0x8000)
    bits &= np.uint32(0x7FFFFFFF)
    _round_bits(bits, 13, tmp)
    if tmp.size and tmp.max() >= _F16_INF_BITS:  # overflow, inf or NaN (never for normal draws)
        out[...] = x
        return out
    tmp |= sign
    out.view(np.uint16)[...] = tmp
    return _fix_direct(x, out, direct)


def _round_bits(bits: np.ndarray, drop: int, out: np.ndarray) -> np.ndarray:
    """uint32 bits >> drop, rounded to nearest even, into out."""
    np.right_shift(bits, drop, out=out)
    out &= np.uint32(1)
    out += bits
    out += np.uint32((1 << (drop - 1)) - 1)
    out >>= np.uint32(drop)
    return out


def _round_bf16_ties_once(x: np.ndarray, t: np.ndarray, out: np.ndarray, ties: np.ndarray) -> None:
    """The finite elements whose float32 t is a halfway point between two bfloat16 values,
    rounded once from x: x lies between the two (within half a float32 step of t), so it takes
    the one on its side of t, and the even one where x is t itself. Not ml_dtypes' float64
    cast: its versions before 0.7 go through float32 themselves, and the inputs of a bf16
    config would then differ between machines."""
    where = np.flatnonzero(ties)
    if where.size:
        below = (t.view(np.uint32)[where] >> np.uint32(16)).astype(np.uint16)   # toward zero, sign kept
        ax, at = np.abs(x[where]), np.abs(t[where].astype(np.float64))
        up = (ax > at) | ((ax == at) & (below & np.uint16(1)).astype(bool))
        out.view(np.uint16)[where] = below + up.astype(np.uint16)


def _fix_direct(x: np.ndarray, out: np.ndarray, direct: np.ndarray) -> np.ndarray:
    if direct.any():
        where = np.flatnonzero(direct)
        out[where] = x[where]
    return out
