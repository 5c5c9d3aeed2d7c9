"""Verifier metrics (docs/spec.md §4): how far a kernel's outputs are from the reference.

Only measurements live here; which of them gate, and at what bound, is the tolerance
policy's business (sweeps/). Float metrics are computed over the elements where both sides
are finite and are therefore always finite numbers (storable, JSON-safe); every non-finite
disagreement is counted instead (`*_nonfinite`, `lse_inf_mismatch`), and the policy turns
those counts into the `nan` outcome or a failed gate. Large tensors are processed in row
blocks, so verifying an output costs a few blocks of memory, not copies of the whole tensor;
finite blocks (the usual case) go through reference/sliced.py a cache-sized slice at a time.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from attnconfig.outcomes import METRIC_KEYS
from reference.chunks import Workspace
from reference.inputs import as_config
from reference.sliced import REL_FLOOR, TINY, BlockStats, compare_block, partial_rows
from reference.sliced import row_denominator as _row_denominator
from reference.splitkv import RowScales

_BLOCK_ELEMENTS = 1 << 20


def _rows_per_block(shape: tuple[int, ...]) -> int:
    """Rows of one _row_blocks block of an array of this shape."""
    n = shape[-1] if shape else 1
    return max(1, _BLOCK_ELEMENTS // max(n, 1))


def _row_blocks(*arrays: np.ndarray):
    """Yield matching [rows, n] f64-ready blocks of arrays sharing a shape (last axis = row)."""
    shape = arrays[0].shape
    n = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    flat = [a.reshape(rows, n) for a in arrays]
    step = _rows_per_block(shape)
    for r in range(0, rows, step):
        yield [f[r:r + step] for f in flat]


def _cast_ref(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The reference as the output's storage type would hold it, then float64."""
    return np.asarray(ref).astype(out.dtype).astype(np.float64)


class _Accumulator:
    """Running sums and maxima of one comparison, fed block by block."""

    def __init__(self) -> None:
        self.sq_sum = 0.0
        self.count = 0
        self.max_abs = 0.0
        self.max_mag = 0.0
        self.max_rel = 0.0
        self.row_err = 0.0

    def add(self, r: np.ndarray, o: np.ndarray, use: np.ndarray, row_scale: np.ndarray | None = None) -> None:
        """r, o: f64 [rows, n]; use: elements that enter the float metrics; row_scale: [rows]."""
        with np.errstate(invalid="ignore"):  # inf - inf where `use` is false anyway
            diff = np.where(use, np.abs(r - o), 0.0)
        mag = np.where(use, np.maximum(np.abs(r), np.abs(o)), 0.0)
        self.sq_sum += float(np.sum(diff * diff))
        self.count += int(use.sum())
        if diff.size:
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.max_mag = max(self.max_mag, float(mag.max()))
            rel_use = use & (r != 0)
            if rel_use.any():
                rel = diff[rel_use] / np.maximum(np.abs(r[rel_use]), REL_FLOOR)
                self.max_rel = max(self.max_rel, float(rel.max()))
            row = diff.max(axis=-1) / _row_denominator(mag, row_scale)
            self.row_err = max(self.row_err, float(row.max()))

    def add_block(self, block: BlockStats) -> None:
        """add(r, o, use=everywhere) for a finite block, as sliced.compare_block summed it."""
        self.sq_sum += block.sq_sum
        self.count += block.count
        self.max_abs = max(self.max_abs, block.max_abs)
        self.max_mag = max(self.max_mag, block.max_mag)
        self.max_rel = max(self.max_rel, block.max_rel)
        self.row_err = max(self.row_err, block.row_err)

    @property
    def rms(self) -> float:
        if self.count == 0 or self.max_mag == 0:
            return 0.0  # identical all-zero tensors
        return float(np.sqrt(self.sq_sum) / (self.max_mag * np.sqrt(self.count)))


def tensor_metrics(ref: np.ndarray, out: np.ndarray, row_scale: np.ndarray | None = None) -> dict[str, float | int]:
    """max_abs, max_rel, rms, row_err (worst row over the last axis) and nonfinite of out vs ref.

    row_scale (shape without the last axis, optional): the row maxima of the attention of |V|
    (RowScales.out), which scale row_err."""
    return _compare(ref, out, None, row_scale, stats=True)[0]


def _compare(ref: np.ndarray, out: np.ndarray, low: np.ndarray | None, row_scale: np.ndarray | None,
             stats: bool) -> tuple[dict[str, float | int] | None, float | None]:
    """(tensor_metrics(ref, out, row_scale) if stats, err_ratio(ref, out, low) if low is given),
    in one pass over the blocks: the output is read and widened once for both."""
    ref = np.asarray(ref)
    _check_shapes(ref, out)
    if low is not None:
        _check_shapes(ref, low)
    acc = _Accumulator()
    nonfinite = 0
    worst_out = worst_low = 0.0
    scales = None if row_scale is None else np.asarray(row_scale).reshape(-1)
    step = _rows_per_block(np.shape(out))
    work = Workspace()
    for i, blocks in enumerate(_row_blocks(ref, out) if low is None else _row_blocks(ref, out, low)):
        r_raw, o_raw = blocks[0], blocks[1]
        w_raw = None if low is None else blocks[2]
        if not r_raw.size:
            continue
        scale = None if scales is None else scales[i * step:(i + 1) * step].astype(np.float64)
        block, ratio = compare_block(r_raw, o_raw, w_raw, scale, out.dtype, stats, work)
        if block is not None:
            acc.add_block(block)
        elif stats:  # a NaN or an inf in the block: count it, compare the rest under masks
            r, o = _cast_ref(r_raw, out), o_raw.astype(np.float64)
            r_fin, o_fin = np.isfinite(r), np.isfinite(o)
            nonfinite += int(np.isnan(o).sum() + (np.isinf(o) & r_fin).sum())
            acc.add(r, o, r_fin & o_fin, scale)
        if ratio is not None:
            worst_out, worst_low = max(worst_out, ratio[0]), max(worst_low, ratio[1])
        elif w_raw is not None:
            r, o, w = r_raw.astype(np.float64), o_raw.astype(np.float64), w_raw.astype(np.float64)
            use = np.isfinite(r) & np.isfinite(o) & np.isfinite(w)
            if use.any():
                worst_out = max(worst_out, float(np.abs(o[use] - r[use]).max()))
                worst_low = max(worst_low, float(np.abs(w[use] - r[use]).max()))
    metrics = None
    if stats:
        metrics = {"max_abs": acc.max_abs, "max_rel": acc.max_rel, "rms": acc.rms, "row_err": acc.row_err,
                   "nonfinite": nonfinite}
    return metrics, None if low is None else worst_out / max(worst_low, TINY)


def lse_metrics(ref: np.ndarray, out: np.ndarray) -> dict[str, float | int]:
    """As tensor_metrics for LSE: matched -inf are exact and left out; -inf against a finite
    value (either way round) is counted in inf_mismatch."""
    _check_shapes(ref, out)
    acc = _Accumulator()
    nonfinite = inf_mismatch = 0
    work = Workspace()
    for r_raw, o_raw in _row_blocks(np.asarray(ref), out):
        block, _ = compare_block(r_raw, o_raw, None, None, out.dtype, True, work)
        if block is not None:
            acc.add_block(block)
            continue
        r, o = _cast_ref(r_raw, out), o_raw.astype(np.float64)
        r_fin, o_fin = np.isfinite(r), np.isfinite(o)
        nonfinite += int(np.isnan(o).sum() + (np.isinf(o) & r_fin).sum())
        inf_mismatch += int(((r == -np.inf) & o_fin).sum() + (r_fin & (o == -np.inf)).sum())
        acc.add(r, o, r_fin & o_fin)
    return {"max_abs": acc.max_abs, "rms": acc.rms, "row_err": acc.row_err, "nonfinite": nonfinite,
            "inf_mismatch": inf_mismatch}


def err_ratio(ref: np.ndarray, out: np.ndarray, low: np.ndarray) -> float:
    """max|out - ref| / max(max|low - ref|, tiny), over elements where all three are finite.

    ref is taken as given (not rounded to the storage type), as in FlashAttention's rule:
    rounding it would make max|low - ref| exactly 0 on small tensors and the ratio explode.
    """
    return _compare(ref, out, low, None, stats=False)[1]


def partial_metrics(ref_o: np.ndarray, ref_lse: np.ndarray, valid: np.ndarray,
                    o_partials: np.ndarray | None, lse_partials: np.ndarray | None,
                    row_scale: np.ndarray | None = None) -> dict[str, float | int]:
    """Partials vs the reference partials at the same block_n (docs/spec.md §4, §5 gate 3).

    row_err and lse_max_abs over valid (split, row) entries; invalid_bad counts invalid or
    empty entries that are not exactly O_s = 0 and LSE_s = -inf; nonfinite counts NaN, and
    inf where the reference partial is finite. row_scale [S, ...] (RowScales.partials) scales
    row_err as in tensor_metrics.
    """
    S = ref_lse.shape[0]
    if o_partials is not None:
        _check_shapes(ref_o, o_partials)
    if lse_partials is not None:
        _check_shapes(ref_lse, lse_partials)
    n_rows = valid.size
    dv = ref_o.shape[-1]
    step = max(1, _BLOCK_ELEMENTS // max(dv, 1))
    valid_flat = valid.reshape(n_rows)
    row_err = lse_max_abs = 0.0
    invalid_bad = nonfinite = 0
    work = Workspace()
    for s in range(S):
        for r0 in range(0, n_rows, step):
            rows = slice(r0, r0 + step)
            is_valid = s < valid_flat[rows]
            bad = np.zeros(is_valid.shape, dtype=bool)
            if o_partials is not None:
                o32 = o_partials[s].reshape(n_rows, dv)[rows]
                zeros = not is_valid.all() and _all_positive_zero(o32)  # empty splits: the usual case
                scale = None if row_scale is None else row_scale[s].reshape(n_rows)[rows].astype(np.float64)
                fast = _partial_o_block(ref_o[s].reshape(n_rows, dv)[rows], o32, is_valid, scale, zeros, work)
                if fast is not None:
                    row_err = max(row_err, fast)
                else:
                    r = ref_o[s].reshape(n_rows, dv)[rows].astype(np.float64)
                    o = o32.astype(np.float64)
                    nonfinite += int(np.isnan(o).sum() + (np.isinf(o) & np.isfinite(r)).sum())
                    use = np.isfinite(r) & np.isfinite(o) & is_valid[:, None]
                    diff = np.where(use, np.abs(np.where(use, r, 0) - np.where(use, o, 0)), 0.0)
                    mag = np.where(use, np.maximum(np.abs(r), np.abs(o)), 0.0)
                    if diff.size:
                        row_err = max(row_err, float((diff.max(axis=-1) / _row_denominator(mag, scale)).max()))
                if not is_valid.all() and not zeros:
                    bad |= np.any(o32 != 0, axis=-1)
            if lse_partials is not None:
                r = ref_lse[s].reshape(n_rows)[rows].astype(np.float64)
                o = lse_partials[s].reshape(n_rows)[rows].astype(np.float64)
                nonfinite += int(np.isnan(o).sum() + (np.isinf(o) & np.isfinite(r)).sum())
                use = np.isfinite(r) & np.isfinite(o) & is_valid
                if use.any():
                    lse_max_abs = max(lse_max_abs, float(np.abs(r[use] - o[use]).max()))
                bad |= o != -np.inf
            invalid_bad += int((bad & ~is_valid).sum())
    return {"row_err": row_err, "lse_max_abs": lse_max_abs, "invalid_bad": invalid_bad, "nonfinite": nonfinite}


def _all_positive_zero(x: np.ndarray) -> bool:
    """Every element's bits are 0 (+0.0): one integer max, about ten times faster than comparing
    floats, for the splits of a large split_kv that hold no key. False says nothing: -0.0 is a
    zero too, the float comparison decides then."""
    return x.size == 0 or not x.view(f"u{x.dtype.itemsize}").max()


def _partial_o_block(r32: np.ndarray, o32: np.ndarray, is_valid: np.ndarray, scale: np.ndarray | None,
                     zeros: bool = False, work: Workspace | None = None) -> float | None:
    """The worst valid row's error of one block of partials when every element of the block is
    finite (then nothing counts as nonfinite); None when one is not (the caller's masked path).

    A block where no row is valid only has to be all zeros: most of a large split_kv's splits
    hold no key, and checking them costs one pass instead of the f64 comparison. `zeros`: the
    caller found every bit of o32 zero."""
    if not is_valid.any():
        return 0.0 if zeros or not np.count_nonzero(o32) else None
    if not o32.size:  # rows of no element
        return 0.0
    row_diff, row_mag = partial_rows(r32, o32, work if work is not None else Workspace())
    if not (np.isfinite(row_diff).all() and np.isfinite(row_mag).all()):
        return None
    row = row_diff / _row_denominator(row_mag[:, None], scale)
    return float(row[is_valid].max())


def verify_outputs(config: AttentionConfig | Mapping[str, Any], ref_result: Any, low_out: np.ndarray | None,
                   out: np.ndarray, lse: np.ndarray | None, o_partials: np.ndarray | None = None,
                   lse_partials: np.ndarray | None = None, *,
                   exact: tuple[np.ndarray, np.ndarray] | None = None,
                   magnitude: RowScales | None = None) -> dict[str, float | int | None]:
    """Every docs/spec.md §4 metric of one run, as the flat dict the store keeps (None: not applicable).

    ref_result is the split-KV reference (reference.splitkv.SplitKVResult) at the block_n the
    kernel ran. O and LSE are compared with its out_f32 / lse_f32 unless `exact` gives the
    float64 (out, lse) of attention_exact; the partials always with its partials.
    `magnitude` scales the row errors of O and of the partials: the RowScales of
    attention_splitkv(magnitude=True) (or RowScales.of(magnitude_reference(...))).
    """
    c = as_config(config)
    ref_out, ref_lse = exact if exact is not None else (ref_result.out_f32, ref_result.lse_f32)
    metrics: dict[str, float | int | None] = dict.fromkeys(METRIC_KEYS)
    o, ratio = _compare(ref_out, out, low_out, None if magnitude is None else magnitude.out, stats=True)
    metrics.update(out_rms=o["rms"], out_row_err=o["row_err"], out_max_abs=o["max_abs"],
                   out_max_rel=o["max_rel"], out_nonfinite=o["nonfinite"])
    if low_out is not None:
        metrics["out_err_ratio"] = ratio
    if lse is not None:
        m = lse_metrics(ref_lse, lse)
        metrics.update(lse_rms=m["rms"], lse_max_abs=m["max_abs"], lse_row_err=m["row_err"],
                       lse_inf_mismatch=m["inf_mismatch"], lse_nonfinite=m["nonfinite"])
    if o_partials is not None or lse_partials is not None:
        if ref_result.lse_partials.shape[0] != c.split_kv:
            raise ValueError(f"reference has {ref_result.lse_partials.shape[0]} splits, config split_kv={c.split_kv}")
        p = partial_metrics(ref_result.o_partials, ref_result.lse_partials, ref_result.valid_splits,
                            o_partials, lse_partials, row_scale=None if magnitude is None else magnitude.partials)
        metrics.update(partials_row_err=p["row_err"], partials_lse_max_abs=p["lse_max_abs"],
                       partials_invalid_bad=p["invalid_bad"], partials_nonfinite=p["nonfinite"])
    return metrics


def _check_shapes(ref: np.ndarray, out: np.ndarray) -> None:
    if np.shape(ref) != np.shape(out):
        raise ValueError(f"shape mismatch: reference {np.shape(ref)} vs output {np.shape(out)}")
