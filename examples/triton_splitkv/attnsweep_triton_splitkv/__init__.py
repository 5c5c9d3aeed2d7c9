"""A split-KV attention kernel in Triton, written as an attnsweep kernel plug-in.

Each query row's keys are cut into `split_kv` splits of 32-key blocks (attnsweep's docs/spec.md
§3); one program per (row, split) writes the split's partial output and log-sum-exp, a second
kernel combines them. Every layout is read through strides, so transposed inputs cost nothing.
The partials are returned too, and attnsweep checks them against its reference.

Defect switch: `TritonSplitKVDefect` (entry point `triton-splitkv-defect`) lets each row see
one key past the causal diagonal, the off-by-one a sweep must catch.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

__version__ = "0.1.0"
BLOCK_N = 32
MAX_HEAD_DIM = 256
_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


# Sizes, strides and switches are run-time arguments, not specialised on: a sweep's configs then
# share a handful of compiled variants (the head-dim blocks and the defect switch) instead of one
# each.
_SIZES = ["sq_b", "sq_h", "sq_s", "sq_d", "sk_b", "sk_h", "sk_s", "sk_d", "sv_b", "sv_h", "sv_s", "sv_d",
          "seq_q", "seq_k", "heads_q", "group", "dqk", "dv", "splits", "rows"]


@triton.jit(do_not_specialize=_SIZES + ["has_bias", "causal", "has_prefix", "has_cache"])
def _partials(Q, K, V, Bias, PrefixOffset, CurrentSeqLen, OPart, LsePart,
              sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
              seq_q, seq_k, heads_q, group, dqk, dv, splits, rows, scale, has_bias, causal, has_prefix, has_cache,
              DEFECT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    s = row % seq_q
    h = (row // seq_q) % heads_q
    b = row // (seq_q * heads_q)
    hk = h // group
    last = seq_k - 1
    if has_cache:
        last = tl.load(CurrentSeqLen + b)
    limit = last
    if causal:
        shift = s * 0
        if has_prefix:
            shift = tl.load(PrefixOffset + b)
        if DEFECT:
            shift += 1
        limit = tl.minimum(last, s + shift)
    n_blocks = (last + BLOCK_N) // BLOCK_N
    per_split = (n_blocks + splits - 1) // splits
    first = split * per_split
    stop = tl.minimum(first + per_split, n_blocks)
    dq = tl.arange(0, BLOCK_DQK)
    dvs = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * sq_b + h * sq_h + s * sq_s + dq * sq_d, mask=dq < dqk, other=0.0).to(tl.float32)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_DV,), tl.float32)
    for blk in range(first, stop):
        n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        visible = n <= limit
        k = tl.load(K + b * sk_b + hk * sk_h + n[:, None] * sk_s + dq[None, :] * sk_d,
                    mask=visible[:, None] & (dq[None, :] < dqk), other=0.0).to(tl.float32)
        logits = tl.sum(k * q[None, :], axis=1) * scale
        if has_bias:
            bias = tl.load(Bias + ((b * heads_q + h) * seq_q + s) * seq_k + n, mask=visible, other=0.0)
            logits += bias.to(tl.float32)
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, axis=0))
        keep = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_new))
        p = tl.where(visible, tl.exp(logits - m_new), 0.0)
        v = tl.load(V + b * sv_b + hk * sv_h + n[:, None] * sv_s + dvs[None, :] * sv_d,
                    mask=visible[:, None] & (dvs[None, :] < dv), other=0.0).to(tl.float32)
        acc = acc * keep + tl.sum(p[:, None] * v, axis=0)
        l = l * keep + tl.sum(p, axis=0)
        m = tl.where(tl.max(visible.to(tl.int32), axis=0) > 0, m_new, m)
    out = tl.where(l > 0, acc / tl.maximum(l, 1e-30), 0.0)
    lse = tl.where(l > 0, m + tl.log(tl.maximum(l, 1e-30)), float("-inf"))
    slot = split * rows + row
    tl.store(OPart + slot * dv + dvs, out, mask=dvs < dv)
    tl.store(LsePart + slot, lse)


@triton.jit(do_not_specialize=["so_b", "so_h", "so_s", "so_d", "seq_q", "heads_q", "dv", "splits", "rows"])
def _combine(OPart, LsePart, Out, Lse, so_b, so_h, so_s, so_d, seq_q, heads_q, dv, splits, rows,
             RETURN_LSE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0)
    s = row % seq_q
    h = (row // seq_q) % heads_q
    b = row // (seq_q * heads_q)
    sp = tl.arange(0, BLOCK_S)
    dvs = tl.arange(0, BLOCK_DV)
    lse = tl.load(LsePart + sp * rows + row, mask=sp < splits, other=float("-inf"))
    top = tl.maximum(tl.max(lse, axis=0), -3.402823466e38)
    w = tl.exp(lse - top)
    total = tl.sum(w, axis=0)
    parts = tl.load(OPart + (sp[:, None] * rows + row) * dv + dvs[None, :],
                    mask=(sp[:, None] < splits) & (dvs[None, :] < dv), other=0.0)
    out = tl.where(total > 0, tl.sum(w[:, None] * parts, axis=0) / tl.maximum(total, 1e-30), 0.0)
    tl.store(Out + b * so_b + h * so_h + s * so_s + dvs * so_d, out.to(Out.dtype.element_ty), mask=dvs < dv)
    if RETURN_LSE:
        tl.store(Lse + row, tl.where(total > 0, top + tl.log(tl.maximum(total, 1e-30)), float("-inf")))


def _tensor(array: np.ndarray, device: str, trans: bool) -> torch.Tensor:
    """`array` (logical [..., seq, dim]) on the device, stored [..., dim, seq] when `trans`."""
    host = np.ascontiguousarray(np.swapaxes(array, -1, -2) if trans else array)
    t = torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16) if str(host.dtype) == "bfloat16" \
        else torch.from_numpy(host.copy())
    t = t.to(device)
    return t.transpose(-1, -2) if trans else t


class TritonSplitKV:
    """The plug-in: attnsweep reads name, version, supports and run (docs/plugins.md)."""

    name = "triton-splitkv"
    version = f"{__version__} (triton {triton.__version__})"
    block_n = BLOCK_N
    defect = False

    def __init__(self) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"   # cpu: TRITON_INTERPRET=1

    def supports(self, config):
        if config.dtype == "i8":
            return "dtype_i8: this kernel has no int8 path"
        if max(config.head_dim_qk, config.head_dim_v) > MAX_HEAD_DIM:
            return f"head_dim: this kernel holds a row of at most {MAX_HEAD_DIM} in registers"
        return None

    def run(self, config, inputs):
        c, dev = config, self.device
        q = _tensor(inputs["q"], dev, c.trans_q)
        k = _tensor(inputs["k"], dev, c.trans_k)
        v = _tensor(inputs["v"], dev, c.trans_v)
        bias = _tensor(inputs["bias"], dev, False) if c.with_attn_bias else q
        ints = lambda xs: torch.tensor(xs if xs is not None else [0], dtype=torch.int32, device=dev)  # noqa: E731
        prefix, cache = ints(c.prefix_offset), ints(c.current_seq_len)
        rows, splits = c.g * c.num_heads_q * c.seq_len_q, c.split_kv
        o_part = torch.empty((splits, rows, c.head_dim_v), dtype=torch.float32, device=dev)
        lse_part = torch.empty((splits, rows), dtype=torch.float32, device=dev)
        out = torch.empty((c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), dtype=_DTYPES[c.dtype], device=dev)
        lse = torch.empty((rows,), dtype=torch.float32, device=dev)
        scale = 1.0 / c.head_dim_qk ** 0.5 if c.with_attn_scale else 1.0
        bdq, bdv = (max(16, triton.next_power_of_2(d)) for d in (c.head_dim_qk, c.head_dim_v))
        start, end = _events(dev)
        _partials[(rows, splits)](q, k, v, bias, prefix, cache, o_part, lse_part, *q.stride(), *k.stride(), *v.stride(),
                                  c.seq_len_q, c.seq_len_k, c.num_heads_q, c.num_heads_q // c.num_heads_kv,
                                  c.head_dim_qk, c.head_dim_v, splits, rows, scale, int(c.with_attn_bias),
                                  int(c.causal), int(c.prefix_offset is not None), int(c.current_seq_len is not None),
                                  DEFECT=self.defect, BLOCK_N=BLOCK_N, BLOCK_DQK=bdq, BLOCK_DV=bdv)
        _combine[(rows,)](o_part, lse_part, out, lse, *out.stride(), c.seq_len_q, c.num_heads_q, c.head_dim_v,
                          splits, rows, RETURN_LSE=c.return_lse, BLOCK_S=triton.next_power_of_2(splits), BLOCK_DV=bdv)
        run_s = _elapsed(start, end)
        shape = (c.g, c.num_heads_q, c.seq_len_q)
        partials = (o_part.reshape(splits, *shape, c.head_dim_v), lse_part.reshape(splits, *shape)) \
            if c.return_lse else (None, None)
        return {"out": out, "lse": lse.reshape(shape) if c.return_lse else None,
                "o_partials": partials[0], "lse_partials": partials[1], "run_s": run_s}


class TritonSplitKVDefect(TritonSplitKV):
    """The same kernel with its defect switch on: each row sees one key past the causal diagonal."""

    name = "triton-splitkv-defect"
    defect = True


def _events(device: str):
    if device != "cuda":
        return None, None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    return start, end


def _elapsed(start, end) -> float | None:
    if start is None:
        return None
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3
