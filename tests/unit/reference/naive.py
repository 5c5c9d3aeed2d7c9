"""Plain formulas the verifier's fast paths are pinned to (test_reference_fastpaths.py and
test_host_fastpaths.py compare against them)."""
import numpy as np

from reference.metrics import _Accumulator, _row_denominator
from reference.reduce import row_max
from reference.sliced import REL_FLOOR


def naive_partial_metrics(ref_o, ref_lse, valid, o_partials, lse_partials, scale):
    """partial_metrics as first written: every split and row in float64, under masks."""
    S, n_rows, dv = ref_lse.shape[0], valid.size, ref_o.shape[-1]
    valid_flat = valid.reshape(n_rows)
    row_err = lse_max_abs = 0.0
    invalid_bad = nonfinite = 0
    for s in range(S):
        is_valid = s < valid_flat
        r = ref_o[s].reshape(n_rows, dv).astype(np.float64)
        o = o_partials[s].reshape(n_rows, dv).astype(np.float64)
        nonfinite += int(np.isnan(o).sum() + (np.isinf(o) & np.isfinite(r)).sum())
        use = np.isfinite(r) & np.isfinite(o) & is_valid[:, None]
        diff = np.where(use, np.abs(np.where(use, r, 0) - np.where(use, o, 0)), 0.0)
        mag = np.where(use, np.maximum(np.abs(r), np.abs(o)), 0.0)
        row_err = max(row_err, float((diff.max(axis=-1) / _row_denominator(mag, scale[s].reshape(n_rows))).max()))
        bad = ~np.all(o == 0, axis=-1)
        rl = ref_lse[s].reshape(n_rows).astype(np.float64)
        ol = lse_partials[s].reshape(n_rows).astype(np.float64)
        nonfinite += int(np.isnan(ol).sum() + (np.isinf(ol) & np.isfinite(rl)).sum())
        use_l = np.isfinite(rl) & np.isfinite(ol) & is_valid
        if use_l.any():
            lse_max_abs = max(lse_max_abs, float(np.abs(rl[use_l] - ol[use_l]).max()))
        bad |= ol != -np.inf
        invalid_bad += int((bad & ~is_valid).sum())
    return {"row_err": row_err, "lse_max_abs": lse_max_abs, "invalid_bad": invalid_bad, "nonfinite": nonfinite}


def add_finite(acc: _Accumulator, r, o, row_scale=None) -> bool:
    """What the verifier added for a finite float64 block before sliced.compare_block: the
    masked formula's sums with no mask, in whole-block passes. False (nothing added) when an
    element of r or o is not finite; r and o are overwritten."""
    if r.size == 0:
        return True
    mag = np.abs(o)
    with np.errstate(invalid="ignore"):
        diff = np.subtract(r, o, out=o)
    np.abs(diff, out=diff)
    abs_r = np.abs(r, out=r)
    np.maximum(mag, abs_r, out=mag)
    max_mag = float(mag.max())
    if not np.isfinite(max_mag):
        return False
    flat = diff.reshape(-1)
    acc.sq_sum += float(np.dot(flat, flat))
    acc.count += diff.size
    acc.max_abs = max(acc.max_abs, float(diff.max()))
    acc.max_mag = max(acc.max_mag, max_mag)
    zero_ref = abs_r == 0
    rel = np.divide(diff, np.maximum(abs_r, REL_FLOOR, out=abs_r), out=abs_r)
    if zero_ref.any():
        rel[zero_ref] = 0.0
    acc.max_rel = max(acc.max_rel, float(rel.max()))
    row = row_max(diff) / _row_denominator(mag, row_scale)
    acc.row_err = max(acc.row_err, float(row.max()))
    return True
