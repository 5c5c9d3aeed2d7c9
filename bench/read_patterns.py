"""Why does the decode kernel stream slower than a plain read? Times read-only kernels over one
2 GiB buffer in the decode kernel's access pattern and in the benchmark's grid-stride pattern,
and lists the kernels cuDNN and flash launch for the decode shapes (name, grid, block, µs).

    python bench/read_patterns.py --out $OUT

Patterns (each prints TB/s):
- grid-stride: every thread steps over the whole buffer (bench/kernels.py's read ceiling), so
  the GPU's resident threads read one contiguous window at a time;
- chunked: block b reads its own contiguous slice, as a decode split does (one stream per
  block, or two: K and V, one after the other), `unroll` 16-byte loads in flight per thread.
A chunked read much slower than grid-stride at the same bytes in flight says the pattern (DRAM
pages, TLB reach) costs bandwidth, not the kernel's pipeline.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels import Timer, _ptr, decode_case, make_inputs  # noqa: E402

SRC = r'''
extern "C" __global__ void chunk_read(const uint4* __restrict__ x, unsigned long long per_stream,
                                      int streams, unsigned* out) {
    unsigned acc = 0;
    for (int st = 0; st < streams; ++st) {
        const uint4* p = x + (blockIdx.x * (unsigned long long)streams + st) * per_stream;
        for (unsigned long long i = threadIdx.x; i < per_stream; i += (unsigned long long)blockDim.x * UNROLL) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const unsigned long long j = i + (unsigned long long)u * blockDim.x;
                v[u] = j < per_stream ? __ldcg(p + j) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    }
    if (acc == 0x12345678u) out[0] = acc;
}
extern "C" __global__ void stride_read(const uint4* __restrict__ x, unsigned long long n, unsigned* out) {
    unsigned acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        uint4 v = x[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}
'''


def patterns(torch, cp, timer, out: list) -> None:
    n = 2 << 30
    buf = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    words = n // 16
    mods = {u: cp.RawModule(code=SRC, options=(f"-DUNROLL={u}",)) for u in (1, 4, 8, 16)}

    def row(name, fn, nbytes):
        t = timer(fn)
        bw = nbytes / t / 1e12
        print(f"{name:<60} {t * 1e6:9.1f} us  {bw:5.2f} TB/s", flush=True)
        out.append({"pattern": name, "us": t * 1e6, "TBps": bw})

    k = mods[1].get_function("stride_read")
    row("grid-stride 8 blocks/SM x 512", lambda: k((sms * 8,), (512,), (_ptr(cp, buf), cp.uint64(words), _ptr(cp, sink))), n)
    for per_sm, threads in ((3, 128), (2, 128), (4, 128), (8, 128), (3, 256)):
        blocks = sms * per_sm
        for unroll in (4, 8, 16):
            for streams in (1, 2):
                per_stream = words // (blocks * streams)
                f = mods[unroll].get_function("chunk_read")
                nbytes = per_stream * blocks * streams * 16
                row(f"chunked {per_sm}/SM x {threads}t, {streams} stream(s), {unroll} loads/thread",
                    lambda f=f, blocks=blocks, threads=threads, ps=per_stream, st=streams:
                    f((blocks,), (threads,), (_ptr(cp, buf), cp.uint64(ps), cp.int32(st), _ptr(cp, sink))),
                    nbytes)


def library_kernels(torch, out: list) -> None:
    """The kernels torch's cuDNN and flash backends launch per decode call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    F = torch.nn.functional
    for shape in ((8, 32, 8, 32768, 128), (8, 32, 8, 4096, 128), (1, 8, 1, 65536, 128), (1, 32, 8, 131072, 128)):
        case = decode_case(shape, "f16")
        t = make_inputs(torch, case.config)
        q, kk, vv = t["q"], t["k"], t["v"]
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    for _ in range(3):
                        F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
                        torch.cuda.synchronize()
            except Exception as exc:
                print(f"{shape} {name}: {exc}"[:200])
                continue
            for ev in prof.events():
                if ev.device_type.name != "CUDA":
                    continue
                rec = {"shape": shape, "backend": name, "kernel": ev.name[:140],
                       "us": ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total}
                print(f"{shape} {name}: {rec['kernel']}  {rec['us']:.1f} us", flush=True)
                out.append(rec)
            trace = Path("/tmp/trace.json")
            prof.export_chrome_trace(str(trace))
            for e in json.loads(trace.read_text()).get("traceEvents", []):
                if e.get("cat") == "kernel":
                    a = e.get("args", {})
                    print(f"    grid {a.get('grid')} block {a.get('block')} regs {a.get('registers per thread')} "
                          f"smem {a.get('shared memory')} {e.get('dur')} us  {e.get('name', '')[:80]}", flush=True)
                    out.append({"shape": shape, "backend": name, "grid": a.get("grid"), "block": a.get("block"),
                                "regs": a.get("registers per thread"), "smem": a.get("shared memory"),
                                "dur_us": e.get("dur"), "name": e.get("name", "")[:200]})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("artifacts"))
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import cupy as cp
    import torch

    timer = Timer(torch, a.iters)
    rows: list = []
    library_kernels(torch, rows)
    patterns(torch, cp, timer, rows)
    (a.out / "read_patterns.json").write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
