"""The host side of a config's launch on CUDA: what DeviceBackend.run pays around the kernel.

    python3 bench/transfers.py [--procs 1,16] [--sizes-mb 1,16,128,512]   (a CUDA machine)

Per buffer size, in one run and on the same data, three ways to move a config's inputs in
and its outputs out, each a fresh device buffer per config as a sweep needs:
  malloc    cuMemAlloc, cuMemcpyHtoD / DtoH from pageable numpy memory, cuMemFree
  pool      the same copies on memory from the device's stream-ordered pool
            (cuMemAllocAsync / cuMemFreeAsync, release threshold raised so the pool keeps it)
  pinned    the pool, copying from and to page-locked host memory (cuMemHostAlloc)
and the ratios to `malloc`. With --procs N, N processes start together (a sweep's workers
share the host's memory bandwidth and the one GPU), and the times are per process: the best of
--repeat, so they show what one copy costs beside the others, not the processes' total rate.
Neither the pool nor page-locked inputs and outputs, each tried in the sweep, moved its
transfers (docs/decisions.md, "Embedded execution").
"""
from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import time

import numpy as np


def _check(result):
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return result[1] if len(result) == 2 else result[1:]


def _measure(args: tuple[list[int], int, mp.Barrier | None]) -> dict[int, dict[str, float]]:
    sizes, repeat, barrier = args
    from cuda.bindings import driver as d

    _check(d.cuInit(0))
    dev = _check(d.cuDeviceGet(0))
    ctx = _check(d.cuDevicePrimaryCtxRetain(dev))
    _check(d.cuCtxSetCurrent(ctx))
    pool = _check(d.cuDeviceGetDefaultMemPool(dev))
    threshold = d.cuuint64_t(8 << 30)
    _check(d.cuMemPoolSetAttribute(pool, d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold))
    out: dict[int, dict[str, float]] = {}
    for nbytes in sizes:
        page = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        back = np.empty(nbytes, np.uint8)
        pinned_in = _check(d.cuMemHostAlloc(nbytes, 0))
        pinned_out = _check(d.cuMemHostAlloc(nbytes, 0))
        ctypes.memmove(pinned_in, page.ctypes.data, nbytes)

        def way_malloc():
            p = _check(d.cuMemAlloc(nbytes))
            _check(d.cuMemcpyHtoD(p, page.ctypes.data, nbytes))
            _check(d.cuMemcpyDtoH(back.ctypes.data, p, nbytes))
            _check(d.cuMemFree(p))

        def way_pool(src=page.ctypes.data, dst=back.ctypes.data):
            p = _check(d.cuMemAllocAsync(nbytes, 0))
            _check(d.cuMemcpyHtoD(p, src, nbytes))
            _check(d.cuMemcpyDtoH(dst, p, nbytes))
            _check(d.cuMemFreeAsync(p, 0))
            _check(d.cuCtxSynchronize())

        def way_pinned():
            way_pool(pinned_in, pinned_out)

        ways = {"malloc": way_malloc, "pool": way_pool, "pinned": way_pinned}
        for fn in ways.values():
            fn()
        if barrier is not None:
            barrier.wait()
        best = {name: float("inf") for name in ways}
        for _ in range(repeat):
            for name, fn in ways.items():   # interleaved: drift hits all three alike
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        out[nbytes] = best
        _check(d.cuMemFreeHost(pinned_in))
        _check(d.cuMemFreeHost(pinned_out))
    d.cuDevicePrimaryCtxRelease(dev)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,16")
    ap.add_argument("--sizes-mb", default="1,16,128,512")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(float(s) * (1 << 20)) for s in args.sizes_mb.split(",")]
    ctx = mp.get_context("spawn")
    for procs in (int(p) for p in args.procs.split(",")):
        if procs == 1:
            results = [_measure((sizes, args.repeat, None))]
        else:
            with ctx.Manager() as manager:
                barrier = manager.Barrier(procs)
                with ctx.Pool(procs) as pool:
                    results = pool.map(_measure, [(sizes, args.repeat, barrier)] * procs)
        print(f"\n{procs} process(es) at once; per process, best of {args.repeat}: HtoD + DtoH of one buffer each way")
        print(f"{'MB':>6} {'malloc ms':>10} {'pool ms':>9} {'pinned ms':>10}   {'pool/malloc':>11} {'pinned/malloc':>13}  pageable GB/s  pinned GB/s")
        for nbytes in sizes:
            t = {k: float(np.median([r[nbytes][k] for r in results])) for k in ("malloc", "pool", "pinned")}
            gb = 2 * nbytes / 1e9
            print(f"{nbytes / 2**20:6.0f} {t['malloc'] * 1e3:10.2f} {t['pool'] * 1e3:9.2f} {t['pinned'] * 1e3:10.2f}"
                  f"   {t['pool'] / t['malloc']:11.2f} {t['pinned'] / t['malloc']:13.2f}  {gb / t['pool']:13.1f}  {gb / t['pinned']:11.1f}")


if __name__ == "__main__":
    main()
