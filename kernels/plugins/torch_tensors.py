"""Inputs as torch tensors for the plug-ins that call torch libraries (torch_sdpa, xformers_splitk):
the storage types of docs/spec.md §1, the trans_* layouts as strided views, the masks of §2."""
from __future__ import annotations

from typing import Any

import numpy as np

from attnconfig import AttentionConfig
from reference.masks import row_key_limits

TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


def tensor(array: np.ndarray, device: str, trans: bool = False) -> Any:
    """`array` (logical [..., seq, dim]) on `device`; with `trans`, stored [..., dim, seq] and
    returned as the logical view of that storage (last-dim stride seq: what a kernel that
    honours the layout reads)."""
    import torch

    physical = np.swapaxes(array, -1, -2) if trans else array
    host = np.ascontiguousarray(physical)
    if str(host.dtype) == "bfloat16":
        t = torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(host.copy())
    t = t.to(device)
    return t.transpose(-1, -2) if trans else t


def key_limits(c: AttentionConfig) -> np.ndarray | None:
    """Last visible key per (batch, query row) [g, Sq], or None when every key is visible."""
    if not c.causal and c.current_seq_len is None:
        return None
    limits = row_key_limits(c)
    return None if bool((limits >= c.seq_len_k - 1).all()) else limits


def bool_mask(c: AttentionConfig, device: str) -> Any:
    """[g, 1, Sq, Sk] True where a key is visible (docs/spec.md §2), or None when all are."""
    import torch

    limits = key_limits(c)
    if limits is None:
        return None
    lim = torch.from_numpy(limits).to(device)
    keys = torch.arange(c.seq_len_k, device=device)
    return (keys[None, None, :] <= lim[:, :, None])[:, None]


def additive_mask(c: AttentionConfig, inputs: dict[str, Any], dtype: Any, device: str, heads: int) -> Any:
    """The bias with -inf where the mask hides a key, [g, heads|1, Sq, Sk] in `dtype`, or None."""
    import torch

    mask = bool_mask(c, device)
    bias = tensor(inputs["bias"], device).to(dtype) if c.with_attn_bias else None
    if mask is None:
        return bias
    if bias is None:
        bias = torch.zeros((c.g, 1, c.seq_len_q, c.seq_len_k), dtype=dtype, device=device)
    return bias.masked_fill(~mask, float("-inf")).expand(c.g, heads if bias.shape[1] == 1 else bias.shape[1],
                                                         c.seq_len_q, c.seq_len_k)


class Timer:
    """Times the code of its `with` block: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device: str):
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> "Timer":
        import time

        import torch

        if self.device == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        import time

        import torch

        if self.device == "cuda":
            self._events[1].record()
            torch.cuda.synchronize()
            self.seconds = self._events[0].elapsed_time(self._events[1]) / 1e3
        else:
            self.seconds = time.perf_counter() - self._t0
