"""`so:PATH`: a compiled kernel behind the C function of attnsweep_kernel.h, loaded with ctypes.

This loader ships with attnsweep; the library it loads did not, so isolation.confined runs it
in a confined process (kernels.plugins.load.is_trusted). It lays the inputs out as the config
says (trans_*), copies them to the library's device ("cpu": numpy buffers; "cuda": torch
tensors on the current GPU), fills the outputs with NaN (a kernel that writes nothing fails),
calls attnsweep_kernel_run and reads the outputs back in the logical layout.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from kernels.errors import NotApplicable, PluginError
from kernels.plugins.interface import KernelOutput, reason_parts
from reference.inputs import output_dtypes, softmax_scale
from reference.layout import to_logical, to_physical

ABI_VERSION = 1
OK, NOT_APPLICABLE = 0, 1
MESSAGE_BYTES = 1024
DTYPE_CODES = {"f16": 0, "bf16": 1, "f32": 2, "i8": 3}
_I32 = ctypes.c_int32


class Config(ctypes.Structure):
    _fields_ = [(n, _I32) for n in ("abi_version", "dtype", "g", "seq_len_q", "seq_len_k", "num_heads_q",
                                     "num_heads_kv", "head_dim_qk", "head_dim_v", "with_attn_scale", "with_attn_bias",
                                     "causal", "return_lse", "split_kv", "trans_q", "trans_k", "trans_v", "trans_o")] + [
        ("softmax_scale", ctypes.c_float), ("quant_scale", ctypes.c_float), ("quant_zero_point", _I32),
        ("prefix_offset", ctypes.POINTER(_I32)), ("current_seq_len", ctypes.POINTER(_I32))]


class Tensors(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "bias", "out", "lse", "stream")]


def _optional_text(lib: ctypes.CDLL, symbol: str) -> str | None:
    fn = getattr(lib, symbol, None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    value = fn()
    return value.decode("utf-8", "replace")[:200] if value else None


class CAbiKernel:
    """The library at `path` as a kernel plug-in."""

    block_n = 32

    def __init__(self, path: str, backend: str | None = None):
        self.path = os.path.abspath(path)
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as exc:
            raise PluginError(f"so:{path}: cannot load the library: {exc}") from None
        run = getattr(self._lib, "attnsweep_kernel_run", None)
        if run is None:
            raise PluginError(f"so:{path}: exports no attnsweep_kernel_run (kernels/plugins/attnsweep_kernel.h)")
        run.restype = ctypes.c_int
        run.argtypes = [ctypes.POINTER(Config), ctypes.POINTER(Tensors), ctypes.c_char_p, ctypes.c_size_t]
        self._run = run
        self._supports = getattr(self._lib, "attnsweep_kernel_supports", None)
        if self._supports is not None:
            self._supports.restype = ctypes.c_int
            self._supports.argtypes = [ctypes.POINTER(Config), ctypes.c_char_p, ctypes.c_size_t]
        with open(self.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        self.name = _optional_text(self._lib, "attnsweep_kernel_name") or os.path.basename(self.path)
        self.version = _optional_text(self._lib, "attnsweep_kernel_version") or f"sha256:{digest}"
        self.device = (_optional_text(self._lib, "attnsweep_kernel_device") or "cpu").strip()
        if self.device not in ("cpu", "cuda"):
            raise PluginError(f"so:{path}: attnsweep_kernel_device says {self.device!r}; cpu or cuda")

    def _config(self, c: AttentionConfig, inputs: Mapping[str, Any] | None = None) -> tuple[Config, list[Any]]:
        keep: list[Any] = []

        def ints(values: list[int] | None) -> Any:
            if values is None:
                return None
            array = (_I32 * len(values))(*values)
            keep.append(array)
            return ctypes.cast(array, ctypes.POINTER(_I32))

        inputs = inputs or {}
        cfg = Config(ABI_VERSION, DTYPE_CODES[c.dtype], c.g, c.seq_len_q, c.seq_len_k, c.num_heads_q, c.num_heads_kv,
                     c.head_dim_qk, c.head_dim_v, c.with_attn_scale, c.with_attn_bias, c.causal, c.return_lse,
                     c.split_kv, c.trans_q, c.trans_k, c.trans_v, c.trans_o, softmax_scale(c),
                     float(inputs.get("quant_scale", 0.0)), int(inputs.get("quant_zero_point", 0)),
                     ints(c.prefix_offset), ints(c.current_seq_len))
        return cfg, keep

    def supports(self, c: AttentionConfig) -> str | None:
        if self._supports is None:
            return None
        cfg, _keep = self._config(c)
        message = ctypes.create_string_buffer(MESSAGE_BYTES)
        status = self._supports(ctypes.byref(cfg), message, MESSAGE_BYTES)
        if status == OK:
            return None
        text = message.value.decode("utf-8", "replace")
        if status == NOT_APPLICABLE:
            return text or "unsupported: attnsweep_kernel_supports said so"
        raise PluginError(f"attnsweep_kernel_supports returned status {status}: {text}")

    def run(self, c: AttentionConfig, inputs: Mapping[str, Any]) -> KernelOutput:
        cfg, keep = self._config(c, inputs)
        out_dtype, lse_dtype = output_dtypes(c)
        physical = {"q": to_physical(inputs["q"], c.trans_q), "k": to_physical(inputs["k"], c.trans_k),
                    "v": to_physical(inputs["v"], c.trans_v)}
        if c.with_attn_bias:
            physical["bias"] = np.ascontiguousarray(inputs["bias"])
        out_shape = (c.g, c.num_heads_q, c.head_dim_v, c.seq_len_q) if c.trans_o else \
            (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v)
        lse_shape = (c.g, c.num_heads_q, c.seq_len_q)
        message = ctypes.create_string_buffer(MESSAGE_BYTES)
        if self.device == "cuda":
            out, lse, run_s, status = self._run_cuda(cfg, physical, out_shape, lse_shape, out_dtype, lse_dtype,
                                                     c.return_lse, message)
        else:
            out = np.full(out_shape, np.nan, dtype=out_dtype)
            lse = np.full(lse_shape, np.nan, dtype=lse_dtype) if c.return_lse else None
            ptrs = {k: a.ctypes.data for k, a in physical.items()}
            tensors = Tensors(ptrs["q"], ptrs["k"], ptrs["v"], ptrs.get("bias"), out.ctypes.data,
                              lse.ctypes.data if lse is not None else None, None)
            import time

            t0 = time.perf_counter()
            status = self._run(ctypes.byref(cfg), ctypes.byref(tensors), message, MESSAGE_BYTES)
            run_s = time.perf_counter() - t0
        del keep
        text = message.value.decode("utf-8", "replace")
        if status == NOT_APPLICABLE:
            raise NotApplicable(*reason_parts(text or "unsupported: the kernel said so"))
        if status != OK:
            raise PluginError(f"attnsweep_kernel_run returned status {status}: {text}")
        return KernelOutput(to_logical(out, c.trans_o), lse, run_s=run_s)

    def _run_cuda(self, cfg: Config, physical: dict[str, np.ndarray], out_shape: tuple[int, ...],
                  lse_shape: tuple[int, ...], out_dtype: np.dtype, lse_dtype: np.dtype, return_lse: bool,
                  message: Any) -> tuple[np.ndarray, np.ndarray | None, float, int]:
        import torch

        from kernels.plugins.torch_tensors import Timer, tensor

        device = {k: tensor(a, "cuda") for k, a in physical.items()}
        torch_dtype = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
        out = torch.full(out_shape, float("nan"), dtype=torch_dtype[str(out_dtype)], device="cuda")
        lse = torch.full(lse_shape, float("nan"), dtype=torch_dtype[str(lse_dtype)], device="cuda") if return_lse else None
        stream = torch.cuda.current_stream().cuda_stream
        tensors = Tensors(device["q"].data_ptr(), device["k"].data_ptr(), device["v"].data_ptr(),
                          device["bias"].data_ptr() if "bias" in device else None, out.data_ptr(),
                          lse.data_ptr() if lse is not None else None, stream)
        with Timer("cuda") as timer:
            status = self._run(ctypes.byref(cfg), ctypes.byref(tensors), message, MESSAGE_BYTES)
        host_out = out.float().cpu().numpy().astype(out_dtype)
        host_lse = lse.float().cpu().numpy().astype(lse_dtype) if lse is not None else None
        return host_out, host_lse, timer.seconds, status
