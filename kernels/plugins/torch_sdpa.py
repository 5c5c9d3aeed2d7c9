"""`torch-sdpa:math|flash|efficient|cudnn`: torch's scaled_dot_product_attention pinned to one backend.

The mapping of a config (docs/plugins.md has the table):
- scale: passed explicitly, 1/sqrt(head_dim_qk) or 1;
- GQA: `enable_gqa` (the LSE path of efficient and cudnn repeats K and V per query head);
- masks (§2): the top-left causal mask without a prefix or KV cache is `is_causal`; any other
  mask is a boolean `attn_mask` (the bias with -inf where hidden, when there is a bias) for the
  backends that take one. flash takes no mask: a KV cache runs one batch entry at a time on its
  valid keys, and a causal prefix it cannot express is not applicable;
- layouts: `trans_*` inputs are strided views of [..., dim, seq] storage;
- LSE: with `return_lse` the backend's own aten op is called (flash, efficient, cudnn return
  the log-sum-exp); math returns none, so it says not_applicable;
- split_kv: torch picks its own splits; the config's count does not reach it.
Before a fused backend runs, torch's own check (`can_use_*_attention`) is asked; its refusal is
the config's not_applicable reason ("refused: <torch's first warning>").
"""
from __future__ import annotations

from math import sqrt
import warnings
from typing import Any, Mapping

from attnconfig import AttentionConfig
from kernels.errors import NotApplicable
from kernels.plugins.interface import KernelOutput, one_line
from kernels.plugins.torch_tensors import TORCH_DTYPES, Timer, additive_mask, bool_mask, key_limits, tensor

BACKENDS = ("math", "flash", "efficient", "cudnn")
LARGE = 1 << 26   # attention-matrix elements past which a config's memory is given back after it


def _causal_is_top_left(c: AttentionConfig) -> bool:
    """The config's mask is exactly torch's is_causal (top-left, no prefix, no KV cache)."""
    return c.causal and c.current_seq_len is None and not any(c.prefix_offset or ())


def _flash_plan(c: AttentionConfig) -> list[tuple[int, bool]] | str:
    """flash takes no mask: per batch entry (keys it runs on, is_causal), or why it cannot."""
    plan = []
    for b in range(c.g):
        n = c.last_valid_key(b) + 1
        p = c.prefix_offset[b] if c.prefix_offset else 0
        if not c.causal or p >= n - 1:      # the causal mask hides none of the n keys
            plan.append((n, False))
        elif p == 0:
            plan.append((n, True))
        else:
            return (f"causal_prefix: flash takes no mask, and its is_causal is top-left (prefix_offset "
                    f"{p} of batch entry {b} is not)")
    return plan


def _pad_dim(t: Any, multiple: int) -> Any:
    import torch.nn.functional as F

    extra = -t.shape[-1] % multiple
    return F.pad(t, (0, extra)) if extra else t


class TorchSdpa:
    """One backend of torch's SDPA as a kernel plug-in."""

    block_n = 32

    def __init__(self, which: str, backend: str | None = None):
        import torch

        if which not in BACKENDS:
            raise ValueError(f"torch-sdpa: backend {which!r} is not one of {', '.join(BACKENDS)}")
        self.which = which
        self.name = f"torch-sdpa:{which}"
        gpu = backend in (None, "auto", "cuda", "hip") and torch.cuda.is_available()
        self.device = "cuda" if gpu else "cpu"
        self.version = f"torch {torch.__version__}"
        if which == "cudnn" and gpu:
            self.version += f", cudnn {torch.backends.cudnn.version()}"
        from torch.nn.attention import SDPBackend

        self._backend = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                         "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[which]

    def supports(self, c: AttentionConfig) -> str | None:
        if c.dtype == "i8":
            return "dtype_i8: SDPA has no int8 Q·K with a zero point and a quantisation scale"
        if self.device == "cpu" and self.which in ("efficient", "cudnn"):
            return f"device_cpu: the {self.which} backend runs on CUDA only"
        if c.dtype == "f32" and self.which in ("flash", "cudnn"):
            return f"dtype_f32: the {self.which} backend takes f16 and bf16 only"
        if c.return_lse and self.which == "math":
            return "no_lse: the math backend returns no log-sum-exp"
        if self.which == "flash":
            if c.with_attn_bias:
                return "bias: the flash backend takes no attention bias"
            if c.head_dim_qk != c.head_dim_v:
                return "head_dims_differ: the flash backend takes one head dim for Q, K and V"
            plan = _flash_plan(c)
            if isinstance(plan, str):
                return plan
        return None

    # -- running -------------------------------------------------------------------------------
    def _refusal(self, q: Any, k: Any, v: Any, mask: Any, causal: bool, gqa: bool) -> str | None:
        """torch's own reason why this backend refuses these tensors (CUDA only), or None."""
        if self.device != "cuda" or self.which == "math":
            return None
        import torch

        check = {"flash": torch.backends.cuda.can_use_flash_attention,
                 "efficient": torch.backends.cuda.can_use_efficient_attention,
                 "cudnn": torch.backends.cuda.can_use_cudnn_attention}[self.which]
        try:
            params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, causal, gqa)
        except TypeError:   # torch before enable_gqa
            params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, causal)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ok = check(params, True)
        if ok:
            return None
        said = [one_line(w.message, 300) for w in seen if str(w.message).strip()]
        return "; ".join(said[:2]) or "torch's check refused the inputs"

    def run(self, c: AttentionConfig, inputs: Mapping[str, Any]) -> KernelOutput:
        try:
            return self._run(c, inputs)
        finally:
            if self.device == "cuda" and c.g * c.num_heads_q * c.seq_len_q * c.seq_len_k > LARGE:
                import torch

                # torch's allocator keeps what a large config took; the sweep's other processes
                # share the GPU and would run out of memory beside it.
                torch.cuda.empty_cache()

    def _run(self, c: AttentionConfig, inputs: Mapping[str, Any]) -> KernelOutput:
        import torch

        dev = self.device
        dtype = getattr(torch, TORCH_DTYPES[c.dtype])
        q = tensor(inputs["q"], dev, c.trans_q)
        k = tensor(inputs["k"], dev, c.trans_k)
        v = tensor(inputs["v"], dev, c.trans_v)
        scale = 1.0 / sqrt(c.head_dim_qk) if c.with_attn_scale else 1.0
        gqa = c.num_heads_q != c.num_heads_kv
        if self.which == "flash":
            return self._flash(c, q, k, v, scale, gqa)
        causal = _causal_is_top_left(c) and not c.with_attn_bias
        if causal:
            mask = None
        elif c.with_attn_bias or (c.return_lse and self.which != "math"):
            mask = additive_mask(c, inputs, dtype, dev, c.num_heads_q)
        else:
            mask = bool_mask(c, dev)
        if not c.return_lse:
            why = self._refusal(q, k, v, mask, causal, gqa)
            if why:
                raise NotApplicable("refused", why)
            out, seconds = self._sdpa(q, k, v, mask, causal, scale, gqa)
            return KernelOutput(out, run_s=seconds)
        # The LSE comes from the backend's own op, on K and V repeated per query head.
        if gqa:
            k, v = k.repeat_interleave(c.gqa_ratio, dim=1), v.repeat_interleave(c.gqa_ratio, dim=1)
        if mask is not None:
            # The memory-efficient kernels read the bias in rows aligned to 16 elements.
            padded = torch.zeros((*mask.shape[:-1], mask.shape[-1] + (-mask.shape[-1] % 16)), dtype=dtype, device=dev)
            padded[..., :mask.shape[-1]] = mask
            mask = padded[..., :c.seq_len_k]
        why = self._refusal(q, k, v, mask, causal, False)
        if why:
            raise NotApplicable("refused", why)
        op = {"efficient": torch.ops.aten._scaled_dot_product_efficient_attention,
              "cudnn": torch.ops.aten._scaled_dot_product_cudnn_attention}[self.which]
        with Timer(dev) as timer:
            if self.which == "efficient":
                got = op(q, k, v, mask, True, 0.0, causal, scale=scale)
            else:
                got = op(q, k, v, mask, True, 0.0, causal, False, scale=scale)
        return KernelOutput(got[0], _lse(got[1], c), run_s=timer.seconds)

    def _sdpa(self, q: Any, k: Any, v: Any, mask: Any, causal: bool, scale: float, gqa: bool) -> tuple[Any, float]:
        """scaled_dot_product_attention pinned to this backend, and its time; torch's refusal
        ("No available kernel", with the reasons it warned) is NotApplicable."""
        import torch

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                with torch.nn.attention.sdpa_kernel([self._backend]), Timer(self.device) as timer:
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
            except RuntimeError as exc:
                if "No available kernel" not in str(exc):
                    raise
                said = [one_line(w.message, 300) for w in seen if str(w.message).strip()]
                raise NotApplicable("refused", "; ".join(said[:2]) or one_line(exc)) from None
        return out, timer.seconds

    def _flash(self, c: AttentionConfig, q: Any, k: Any, v: Any, scale: float, gqa: bool) -> KernelOutput:
        """flash: one call, or one per batch entry on its valid keys (a KV cache)."""
        import torch

        plan = _flash_plan(c)
        if isinstance(plan, str):   # supports() said so already; a direct caller hears it too
            raise NotApplicable(*plan.split(": ", 1))
        whole = key_limits(c) is None or all(n == c.seq_len_k for n, _ in plan) and len({cz for _, cz in plan}) == 1
        pieces = [(slice(None), c.seq_len_k, plan[0][1])] if whole else [
            (slice(b, b + 1), n, causal) for b, (n, causal) in enumerate(plan)]
        outs, lses, seconds = [], [], 0.0
        for rows, n, causal in pieces:
            qb, kb, vb = q[rows], k[rows, :, :n], v[rows, :, :n]
            why = self._refusal(qb, kb, vb, None, causal, gqa)
            if why:
                raise NotApplicable("refused", why)
            if not c.return_lse:
                out, piece_s = self._sdpa(qb, kb, vb, None, causal, scale, gqa)
                outs.append(out)
                seconds += piece_s
                continue
            # The op wants head dims in multiples of 8 (SDPA pads them the same way) and the
            # dense layout; the padding's zeros add nothing to Q·K and fall off O.
            qp, kp, vp = (_pad_dim(t.contiguous(), 8) for t in (qb, kb, vb))
            with Timer(self.device) as timer:
                if self.device == "cpu":   # torch's CPU flash kernel: no GQA of its own
                    if gqa:
                        kp, vp = kp.repeat_interleave(c.gqa_ratio, dim=1), vp.repeat_interleave(c.gqa_ratio, dim=1)
                    got = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qp, kp, vp, 0.0, causal,
                                                                                     scale=scale)
                else:
                    got = torch.ops.aten._scaled_dot_product_flash_attention(qp, kp, vp, 0.0, causal, False,
                                                                             scale=scale)
            outs.append(got[0][..., :c.head_dim_v])
            lses.append(got[1])
            seconds += timer.seconds
        out = torch.cat(outs) if len(outs) > 1 else outs[0]
        lse = _lse(torch.cat(lses) if len(lses) > 1 else lses[0], c) if lses else None
        return KernelOutput(out, lse, run_s=seconds)


def _lse(lse: Any, c: AttentionConfig) -> Any:
    """[g, Hq, Sq] of an op's log-sum-exp: efficient pads the rows to 32, cudnn adds a last axis."""
    return lse.reshape(c.g, c.num_heads_q, -1)[..., :c.seq_len_q].float()


def math(backend: str | None = None) -> TorchSdpa:  # noqa: F811 - the entry's name is the backend's
    return TorchSdpa("math", backend)


def flash(backend: str | None = None) -> TorchSdpa:
    return TorchSdpa("flash", backend)


def efficient(backend: str | None = None) -> TorchSdpa:
    return TorchSdpa("efficient", backend)


def cudnn(backend: str | None = None) -> TorchSdpa:
    return TorchSdpa("cudnn", backend)
