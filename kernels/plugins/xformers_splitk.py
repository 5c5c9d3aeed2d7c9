"""`xformers-splitk`: xformers' Triton split-K decode kernel (`xformers.ops.fmha.triton_splitk`).

xformers' dispatcher refuses every operator, this one included, when its C++ extensions do not
load (built for another torch: "xFormers wasn't build with CUDA support"), though the split-K
kernel is Triton code that needs none of them. So the plug-in calls the operator's `apply`
below that check, with the operator's own per-input reasons (`not_supported_reasons`, less the
C++ one) asked first.

Mapping (docs/plugins.md): the config's `split_kv` is the operator's split count
(`FwOp.get_operator(split_kv)`); heads as BMGHK with G = num_heads_kv and K, V broadcast over
the query heads of a group (GQA); a KV cache is `BlockDiagonalPaddedKeysMask` (each batch
entry's valid keys); a causal mask is `BlockDiagonalCausalWithOffsetPaddedKeysMask`, which
aligns the diagonal bottom-right, so it maps only where `prefix_offset[b] = keys_b - seq_len_q`
(or where the mask hides nothing); any other mask, and the bias, go in as an additive bias
tensor, which the operator takes with one split only. Head dims: 16, 32, 64, 128, 256 or 512,
the same for Q·K and V; f16 and bf16; the head dim contiguous (no trans_q/k/v).
"""
from __future__ import annotations

from math import sqrt
from typing import Any, Mapping

from attnconfig import AttentionConfig
from kernels.errors import NotApplicable
from kernels.plugins.interface import KernelOutput
from kernels.plugins.torch_tensors import TORCH_DTYPES, Timer, additive_mask, key_limits, tensor

HEAD_DIMS = (16, 32, 64, 128, 256, 512)
MAX_CAUSAL_ROWS = 16   # the operator's causal masks take at most 16 query rows
CPP_REASON = "wasn't build with CUDA support"


def mask_mode(c: AttentionConfig) -> str:
    """How the config's masks and bias reach the operator: none, padded, causal_offset, bias;
    or "why: ..." when they cannot."""
    if c.with_attn_bias:
        return "bias" if c.split_kv == 1 else "bias_with_splits: the operator takes an additive bias with one split only"
    if key_limits(c) is None:
        return "none"
    keys = [c.last_valid_key(b) + 1 for b in range(c.g)]
    prefix = list(c.prefix_offset or [0] * c.g)
    if not c.causal or all(p >= n - 1 for p, n in zip(prefix, keys)):
        return "padded"
    if c.seq_len_q <= MAX_CAUSAL_ROWS and all(p == n - c.seq_len_q for p, n in zip(prefix, keys)):
        return "causal_offset"
    if c.split_kv == 1:
        return "bias"
    return ("causal_alignment: the operator's causal mask is bottom-right aligned (prefix_offset = keys - "
            "seq_len_q, at most 16 rows); this one is not, and a mask as bias takes one split only")


class XformersSplitK:
    name = "xformers-splitk"
    device = "cuda"
    block_n = 32

    def __init__(self, backend: str | None = None):
        import torch
        import triton
        import xformers
        from xformers.ops.fmha import attn_bias, common, triton_splitk

        if not torch.cuda.is_available():
            raise RuntimeError("xformers-splitk runs on a CUDA GPU; torch sees none")
        self.version = f"xformers {xformers.__version__}, triton {triton.__version__}"
        self._op, self._bias, self._inputs = triton_splitk.FwOp, attn_bias, common.Inputs

    def supports(self, c: AttentionConfig) -> str | None:
        if c.dtype not in ("f16", "bf16"):
            return f"dtype_{c.dtype}: the split-K kernel takes f16 and bf16"
        if c.head_dim_qk not in HEAD_DIMS or c.head_dim_v != c.head_dim_qk:
            return (f"head_dim: the split-K kernel takes head dims {', '.join(map(str, HEAD_DIMS))}, the same for "
                    f"Q·K and V (not {c.head_dim_qk}/{c.head_dim_v})")
        if c.trans_q or c.trans_k or c.trans_v:
            return "layout_transposed: the split-K kernel needs the head dim contiguous (stride 1)"
        mode = mask_mode(c)
        return mode if ":" in mode else None

    def run(self, c: AttentionConfig, inputs: Mapping[str, Any]) -> KernelOutput:
        import torch

        mode = mask_mode(c)
        if ":" in mode:
            raise NotApplicable(*mode.split(": ", 1))
        B, Hq, Hkv, Sq, Sk, D, r = c.g, c.num_heads_q, c.num_heads_kv, c.seq_len_q, c.seq_len_k, c.head_dim_qk, c.gqa_ratio
        dtype = getattr(torch, TORCH_DTYPES[c.dtype])
        q = tensor(inputs["q"], "cuda").permute(0, 2, 1, 3).reshape(B, Sq, Hkv, r, D)
        k = tensor(inputs["k"], "cuda").permute(0, 2, 1, 3).reshape(B, Sk, Hkv, 1, D).expand(B, Sk, Hkv, r, D)
        v = tensor(inputs["v"], "cuda").permute(0, 2, 1, 3).reshape(B, Sk, Hkv, 1, D).expand(B, Sk, Hkv, r, D)
        bias: Any = None
        if mode == "bias":
            bias = additive_mask(c, inputs, dtype, "cuda", Hq).reshape(B, Hkv, r, Sq, Sk)
        elif mode in ("padded", "causal_offset"):
            kind = self._bias.BlockDiagonalPaddedKeysMask if mode == "padded" else \
                self._bias.BlockDiagonalCausalWithOffsetPaddedKeysMask
            bias = kind.from_seqlens(q_seqlen=[Sq] * B, kv_padding=Sk,
                                     kv_seqlen=[c.last_valid_key(b) + 1 for b in range(B)], device=q.device)
            q = q.reshape(1, B * Sq, Hkv, r, D)
            k, v = (t.reshape(1, B * Sk, Hkv, 1, D).expand(1, B * Sk, Hkv, r, D) for t in (k[:, :, :, :1], v[:, :, :, :1]))
        scale = 1.0 / sqrt(D) if c.with_attn_scale else 1.0
        inp = self._inputs(query=q, key=k, value=v, attn_bias=bias, scale=scale)
        op = self._op.get_operator(c.split_kv)
        reasons = [r for r in op.not_supported_reasons(inp) if CPP_REASON not in r]
        if reasons:
            raise NotApplicable("refused", "; ".join(reasons))
        with Timer("cuda") as timer:
            out, ctx = op.apply(inp, needs_gradient=c.return_lse)
        out = out.reshape(B, Sq, Hq, D).permute(0, 2, 1, 3)
        lse = None
        if c.return_lse:
            lse = ctx.lse
            if mode in ("padded", "causal_offset"):    # [1, G, H, B * Sq]
                lse = lse.reshape(Hq, B, Sq).permute(1, 0, 2)
            lse = lse.reshape(B, Hq, Sq).float()
        return KernelOutput(out, lse, run_s=timer.seconds)


def plugin(backend: str | None = None) -> XformersSplitK:
    return XformersSplitK(backend)
