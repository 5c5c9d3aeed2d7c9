"""Run one decode shape through our kernels a few times, for a profiler to watch.

    ncu --kernel-name regex:attn_splitkv --launch-skip 2 --launch-count 2 --set full \\
        python tools/profile_shape.py 16,64,8,8192,128 [--dtype f16] [--split 0] [--path auto]

The shape `prefill` (or `prefill-causal`) is bench/kernels.py's prefill case (4096 x 4096, 32
heads, D = 128). split 0: the automatic count. Prints the variant and split that ran and the
median GPU time (CUDA events).
--torch flash (or cudnn) runs torch's kernel on the same shape instead, to profile side by side
(ncu --kernel-name regex:flash_fwd_splitkv_kernel ...).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels import Ours, Timer, decode_case, make_inputs, prefill_case, torch_runner  # noqa: E402
from kernels.autosplit import choose_split_kv, replace_split  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", help="batch,Hq,Hkv,Sk,D, or prefill, or prefill-causal")
    ap.add_argument("--dtype", default="f16")
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--path", default="auto")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--torch", choices=("flash", "cudnn"), help="run torch's SDPA backend instead of ours")
    a = ap.parse_args()

    import torch

    if a.shape.startswith("prefill"):
        case = prefill_case(a.dtype, a.shape == "prefill-causal")
    else:
        case = decode_case(tuple(int(x) for x in a.shape.split(",")), a.dtype)
    inputs = make_inputs(torch, case.config)
    if a.torch:
        run = torch_runner(torch, case.config, inputs, a.torch)
        label = f"torch {a.torch}"
    else:
        from kernels.backends.cuda import CudaBackend

        backend = CudaBackend()
        backend.kernel_path = a.path
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        split = a.split or choose_split_kv(case.config, sms, mma=backend.mma_capable)
        run = Ours(backend).runner(replace_split(case.config, split), inputs)
        label = f"split={split} {run.variant}"
    t = Timer(torch, a.iters)(run)
    rate = f"{case.flops / t / 1e12:.0f} TFLOP/s" if case.kind == "prefill" else f"{case.bytes / t / 1e12:.2f} TB/s"
    print(f"{case.name} {a.dtype} {label}: {t * 1e6:.1f} us, {rate}")


if __name__ == "__main__":
    main()
