"""Our split-KV kernels next to torch's cuDNN and flash attention, in one process.

For each shape, the same inputs go to our kernels (split kernel + combine, launched through the
cuda backend's compiled module) and to torch `scaled_dot_product_attention` restricted to the
cuDNN and to the flash backend. GPU time by CUDA events, L2 flushed before every call,
median of --iters. Effective bandwidth counts the bytes of Q, K, V read (each kv head once,
only the valid keys of a ragged KV cache) and O written. Also measured in the same run: the
device-to-device copy bandwidth and a read-only streaming kernel's bandwidth; for every shape
that kernel's time to read just the shape's bytes, launch and ramp included (a kernel that
only reads them: the floor attention on them is measured against); for every decode shape every
fixed split count against the automatic one (kernels/autosplit.py).

    python bench/kernels.py --out $OUT [--iters 30] [--dtypes f16,bf16] [--quick]

Prints a table per dtype; writes kernels.json under --out (bench/plot_kernels.py draws it).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnconfig import AttentionConfig  # noqa: E402
from kernels.autosplit import choose_split_kv, replace_split  # noqa: E402
from kernels.backends.device import output_buffers  # noqa: E402
from kernels.launch import launch_plan  # noqa: E402

DECODE = [(1, 32, 8, 131072, 128), (8, 32, 8, 32768, 128), (8, 32, 8, 4096, 128), (16, 64, 8, 8192, 128),
          (4, 32, 32, 16384, 128), (1, 8, 1, 65536, 128), (32, 32, 8, 2048, 64),
          (8, 32, 8, 32768, 256), (1, 32, 8, 131072, 256)]
RAGGED = (8, 32, 8, 32768, 128)      # KV cache of 32768 slots, current lengths drawn per batch entry
PREFILL = (1, 32, 32, 4096, 128)     # seq_len_q = seq_len_k = 4096
FIXED_SPLITS = (1, 2, 3, 4, 6, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class Case:
    name: str
    config: AttentionConfig
    bytes: int
    flops: float
    kind: str                     # decode | ragged | prefill
    results: dict = field(default_factory=dict)


def decode_case(shape, dtype, ragged=None) -> Case:
    g, hq, hkv, sk, d = shape
    cfg = AttentionConfig(dtype=dtype, g=g, seq_len_q=1, seq_len_k=sk, num_heads_q=hq, num_heads_kv=hkv,
                          head_dim_qk=d, head_dim_v=d, current_seq_len=ragged)
    keys = sum(x + 1 for x in ragged) if ragged else g * sk
    nbytes = 2 * (g * hq * d * 2 + keys * hkv * d * 2)
    name = f"({g},{hq},{hkv},{sk},{d})" + (" ragged" if ragged else "")
    return Case(name, cfg, nbytes, 4.0 * keys * hq * d, "ragged" if ragged else "decode")


def prefill_case(dtype, causal, head_dim=PREFILL[4]) -> Case:
    g, h, _, s, _ = PREFILL
    d = head_dim
    cfg = AttentionConfig(dtype=dtype, g=g, seq_len_q=s, seq_len_k=s, num_heads_q=h, num_heads_kv=h,
                          head_dim_qk=d, head_dim_v=d, causal=causal)
    flops = 4.0 * g * h * s * s * d / (2 if causal else 1)
    return Case(f"prefill {s}x{s} h{h} d{d}" + (" causal" if causal else ""), cfg, 4 * g * h * s * d * 2, flops, "prefill")


class Timer:
    """Median GPU time of fn() with L2 flushed before each call.

    The flush reads a 256 MiB buffer (never written after it was zeroed), so L2 is left holding
    clean lines: a flush that writes leaves up to the whole L2 dirty, and the next kernel then
    pays for writing it back (about 12 µs on the H200, more than a short decode kernel's own
    reads). After the flush the GPU spins for SPIN_CYCLES (about 50 µs) before the start event,
    so the host has queued fn()'s launches by the time the GPU reaches them: the events then
    time the kernels, not the host's launch path (Python for ours, C++ for torch), alike."""

    SPIN_CYCLES = 100_000

    def __init__(self, torch, iters: int, flush: str = "read"):
        self.torch, self.iters = torch, iters
        self.flush_buf = torch.zeros(64 << 20, dtype=torch.int32, device="cuda")
        self.flush = self.flush_buf.sum if flush == "read" else self.flush_buf.zero_   # write: the old way
        torch.cuda.synchronize()

    def __call__(self, fn) -> float:
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.flush()
            torch.cuda._sleep(self.SPIN_CYCLES)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
        return statistics.median(times)


class Ours:
    """Our kernels on torch-owned device memory: prepare once per config, launch on stream 0."""

    def __init__(self, backend):
        self.backend = backend

    def runner(self, c: AttentionConfig, t: dict):
        import torch

        prepared = self.backend.prepare(c)
        loaded = prepared.handle
        buf = {"q": t["q"].data_ptr(), "k": t["k"].data_ptr(), "v": t["v"].data_ptr()}
        outputs = {name: torch.empty(shape, dtype=getattr(torch, dtype.name), device="cuda")
                   for name, (shape, dtype) in output_buffers(c).items()}
        buf.update({name: b.data_ptr() for name, b in outputs.items()})
        out, keep = outputs["o"], list(outputs.values())
        if c.current_seq_len is not None:
            keep.append(torch.tensor(c.current_seq_len, dtype=torch.int32, device="cuda"))
            buf["current_seq_len"] = keep[-1].data_ptr()
        for name, (count, dtype, zeroed) in self.backend.combine_scratch(c, loaded.variant).items():
            scratch = (torch.zeros if zeroed else torch.empty)(count, dtype=getattr(torch, dtype.name), device="cuda")
            keep.append(scratch)
            buf[name] = scratch.data_ptr()
        launches = launch_plan(c, loaded.variant, buf)
        calls = [self.backend.launcher(loaded.functions[ln.kernel], ln) for ln in launches]

        def run():
            for call in calls:
                call()

        run.out, run.keep, run.variant, run.calls, run.loaded = out, keep, prepared.variant, calls, loaded
        return run


def make_inputs(torch, c: AttentionConfig):
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[c.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = lambda h, s, d: (c.g, h, s, d)  # noqa: E731
    return {"q": torch.randn(shape(c.num_heads_q, c.seq_len_q, c.head_dim_qk), generator=gen, device="cuda", dtype=dt),
            "k": torch.randn(shape(c.num_heads_kv, c.seq_len_k, c.head_dim_qk), generator=gen, device="cuda", dtype=dt),
            "v": torch.randn(shape(c.num_heads_kv, c.seq_len_k, c.head_dim_v), generator=gen, device="cuda", dtype=dt)}


def torch_runner(torch, c: AttentionConfig, t: dict, backend: str):
    """SDPA pinned to one backend; a ragged cache needs a mask, which flash cannot take."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    kw = {"is_causal": c.causal, "enable_gqa": c.num_heads_q != c.num_heads_kv}
    if c.current_seq_len is not None:
        keys = torch.arange(c.seq_len_k, device="cuda")
        last = torch.tensor(c.current_seq_len, device="cuda")
        kw["attn_mask"] = (keys[None, :] <= last[:, None])[:, None, None, :]
    pick = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def run():
        with sdpa_kernel([pick]):
            run.out = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], **kw)

    run()  # raises here if the backend refuses the shape
    return run


def copy_bandwidth(torch, timer):
    """The copy and read-only stream bandwidths of 2 GiB, and a function timing the read-only
    stream over the first nbytes of that buffer (None without cupy)."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t_copy = timer(lambda: dst.copy_(src))
    read_bw = None
    try:
        import cupy as cp

        kern = cp.RawKernel(r'''
        extern "C" __global__ void stream_read(const uint4* __restrict__ x, unsigned long long n, unsigned* out) {
            unsigned acc = 0;
            for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
                 i += (unsigned long long)gridDim.x * blockDim.x) {
                uint4 v = x[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
            if (acc == 0x12345678u) out[0] = acc;   // keeps the loads; practically never written
        }''', "stream_read")
        sink = torch.zeros(1, dtype=torch.int32, device="cuda")
        sms = torch.cuda.get_device_properties(0).multi_processor_count

        def read(nbytes=n, blocks=sms * 8):
            kern((blocks,), (512,), (_ptr(cp, src), cp.uint64(nbytes // 16), _ptr(cp, sink)))

        t_read = timer(read)
        read_bw = n / t_read

        def read_floor(nbytes: int) -> float:   # one wave of blocks or two, whichever is faster
            return min(timer(lambda: read(nbytes, b)) for b in (sms * 4, sms * 8))
        nop = cp.RawKernel('extern "C" __global__ void nop() {}', "nop")
        print(f"an empty kernel times {timer(lambda: nop((1,), (1,), ())) * 1e6:.1f} us (the timing's floor)")
    except Exception as exc:  # cupy missing: torch's sum is a read-only stream as well
        print(f"(cupy read kernel unavailable: {exc}; using torch.sum)")
        as_i32 = src.view(torch.int32)
        t_read = timer(lambda: as_i32.sum())
        read_bw = n / t_read
        read_floor = None
    return {"copy_TBps": 2 * n / t_copy / 1e12, "read_TBps": read_bw / 1e12}, read_floor


def _ptr(cp, tensor):
    mem = cp.cuda.UnownedMemory(tensor.data_ptr(), tensor.numel() * tensor.element_size(), tensor)
    return cp.ndarray((tensor.numel(),), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))


def rel_err(torch, a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def bench_case(torch, timer, ours: Ours, case: Case, num_sms: int, fixed_splits: bool, read_floor=None) -> None:
    c = case.config
    t = make_inputs(torch, c)
    res = case.results
    if read_floor and case.kind != "prefill" and case.bytes <= 2 << 30:   # prefill is compute-bound
        res["read_floor"] = read_floor(case.bytes)
    for be in ("cudnn", "flash"):
        try:
            fn = torch_runner(torch, c, t, be)
            res[be] = timer(fn)
            res[f"{be}_out"] = fn.out
        except Exception as exc:
            res[be] = None
            res[f"{be}_error"] = str(exc).splitlines()[0][:160]
    auto = choose_split_kv(c, num_sms, mma=ours.backend.mma_capable) if case.kind != "prefill" else 1
    run = ours.runner(replace_split(c, auto), t)
    res["ours"], res["ours_split"], res["ours_variant"] = timer(run), auto, run.variant
    if len(run.calls) == 2:   # where the time goes: the split kernel alone, the combine alone
        res["ours_fwd"], res["ours_combine"] = timer(run.calls[0]), timer(run.calls[1])
    res["ours_fused_combine"] = len(run.calls) == 1 and auto > 1
    if res["ours_fused_combine"]:   # the same split with the combine kernel, for comparison
        ours.backend.fuse_combine = False
        try:
            res["ours_two_launches"] = timer(ours.runner(replace_split(c, auto), t))
        finally:
            ours.backend.fuse_combine = True
    ref = res.get("cudnn_out") if res.get("cudnn_out") is not None else res.get("flash_out")
    if ref is not None:
        res["max_rel_err_vs_torch"] = rel_err(torch, run.out, ref)
    if fixed_splits and case.kind != "prefill":
        res["fixed"] = {}
        for s in FIXED_SPLITS:
            if s <= -(-c.seq_len_k // 32):
                res["fixed"][s] = timer(ours.runner(replace_split(c, s), t))
    for k in [k for k in res if k.endswith("_out")]:
        del res[k]
    del t
    torch.cuda.empty_cache()


def fmt_row(case: Case, ceil_read: float) -> str:
    r = case.results
    tb = lambda s: case.bytes / s / 1e12 if s else float("nan")  # noqa: E731
    best = min(x for x in (r.get("cudnn"), r.get("flash"), math.inf) if x)
    ratio = best / r["ours"] if best != math.inf else float("nan")
    us = lambda s: f"{s * 1e6:8.1f}" if s else "     n/a"  # noqa: E731
    extra = ""
    if case.kind == "prefill":
        extra = f"  ours {case.flops / r['ours'] / 1e12:6.1f} TFLOP/s"
    elif r.get("fixed"):
        bs, bt = min(r["fixed"].items(), key=lambda kv: kv[1])
        extra = f"  auto s={r['ours_split']:3d} vs best fixed s={bs:3d}: {bt / r['ours']:5.2f}x"
    if r.get("ours_fused_combine"):
        extra += f"  (combine fused; with the combine kernel {r['ours_two_launches'] * 1e6:.1f} us)"
    if r.get("ours_fwd"):
        extra += f"  (split kernel {r['ours_fwd'] * 1e6:.1f} + combine {r['ours_combine'] * 1e6:.1f} us alone)"
    return (f"{case.name:34} {us(r['ours'])} {us(r.get('cudnn'))} {us(r.get('flash'))}   "
            f"{tb(r['ours']):5.2f} {tb(r.get('cudnn')):5.2f} {tb(r.get('flash')):5.2f}   "
            f"{ratio:5.2f}x  {tb(r['ours']) * 1e12 / ceil_read:5.2f} {us(r.get('read_floor'))} "
            f"err {r.get('max_rel_err_vs_torch', float('nan')):.1e}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--quick", action="store_true", help="fewer shapes, no fixed-split scan (a smoke run)")
    ap.add_argument("--no-fixed", action="store_true", help="skip the fixed-split scan")
    ap.add_argument("--flush", default="read", choices=("read", "write"),
                    help="how L2 is flushed between calls: read a buffer (clean L2) or write one (the "
                         "next kernel pays the dirty lines' write-back, as in the runs of 2026-12-03)")
    ap.add_argument("--path", default="auto", choices=("auto", "mma", "grouped", "rowwise"),
                    help="our kernel path (auto: mma on sm_80+ where it applies)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)

    import numpy as np
    import torch
    from kernels.backends.cuda import CudaBackend

    backend = CudaBackend()
    backend.kernel_path = a.path
    ours = Ours(backend)
    timer = Timer(torch, a.iters, a.flush)
    props = torch.cuda.get_device_properties(0)
    ceil, read_floor = copy_bandwidth(torch, timer)
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
          f"{backend.compiler_version()}; copy {ceil['copy_TBps']:.2f} TB/s, read-only stream {ceil['read_TBps']:.2f} TB/s")
    rng = np.random.default_rng(7)
    summary = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
               "compiler": backend.compiler_version(), "bandwidth": ceil, "date": time.strftime("%Y-%m-%d"),
               "flush": a.flush,
               "cases": []}
    for dtype in a.dtypes.split(","):
        cases = [decode_case(s, dtype) for s in (DECODE[:3] + DECODE[5:6] if a.quick else DECODE)]
        ragged = [int(x) for x in rng.integers(1024, RAGGED[3], size=RAGGED[0])]
        cases.append(decode_case(RAGGED, dtype, ragged=ragged))
        cases += [prefill_case(dtype, False), prefill_case(dtype, True)]
        print(f"\n== {dtype}: GPU time (us), effective TB/s, ours / faster of cuDNN and flash "
              f"(>1 = ours faster), ours / read-only stream ceiling, the read-only stream's time (us) for "
              f"this shape's bytes alone")
        print(f"{'shape (b,Hq,Hkv,Sk,D)':34} {'ours':>8} {'cuDNN':>8} {'flash':>8}   {'ours':>5} {'cuDNN':>5} {'flash':>5}   "
              f"{'ratio':>6}  {'/read':>5} {'floor':>8}")
        for case in cases:
            try:
                bench_case(torch, timer, ours, case, props.multi_processor_count, not (a.quick or a.no_fixed),
                           read_floor)
                print(fmt_row(case, ceil["read_TBps"] * 1e12), flush=True)
            except Exception as exc:
                case.results["error"] = repr(exc)[:300]
                print(f"{case.name:34} ERROR {exc!r}"[:300], flush=True)
            summary["cases"].append({"dtype": dtype, "name": case.name, "kind": case.kind, "bytes": case.bytes,
                                     "flops": case.flops, **case.results})
        dec = [x for x in summary["cases"] if x["dtype"] == dtype and x["kind"] == "decode" and x.get("ours")]
        ratios = [min(v for v in (x.get("cudnn"), x.get("flash")) if v) / x["ours"] for x in dec
                  if x.get("cudnn") or x.get("flash")]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"decode geometric mean ours / faster of cuDNN and flash: {gm:.2f}x (min {min(ratios):.2f}x)")
            summary[f"decode_geomean_{dtype}"] = gm
    (a.out / "kernels.json").write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
