"""GPU evidence for the kernels issue: one run that compiles every variant, checks a matrix of
configs against the host reference, shows each defect's symptom, compares with torch SDPA and
times a few shapes. Writes summary.json and configs.jsonl under --out.

    python tests/gpu/gpu_evidence.py --out $OUT [--random 300] [--backend cuda]

(`--backend hostemu` runs the same script on the host emulation of tests/unit/kernels, with
small sizes, to check the script itself without a GPU.)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attnconfig import AttentionConfig  # noqa: E402
from attnconfig.footprint import splitkv_extra_bytes  # noqa: E402
from kernels.backend import DEFECTS  # noqa: E402
from kernels.cache import KernelCache  # noqa: E402
from kernels.variants import GENERAL_BUCKET, HEAD_DIM_BUCKETS, Variant  # noqa: E402


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


T = _load(ROOT / "tests/gpu/test_cuda_backend.py", "gpu_cases")


def make_backend(kind: str, defects=frozenset(), cache=None):
    if kind == "cuda":
        from kernels.cuda import CudaBackend

        return CudaBackend(frozenset(defects), cache=cache)
    emu = _load(ROOT / "tests/unit/kernels/test_variants.py", "emu_tests")
    return emu.HostEmuBackend(frozenset(defects), cache=cache)


def run_one(backend, c: AttentionConfig):
    from reference import make_inputs

    inputs = make_inputs(c)
    prepared = backend.prepare(c)
    res = backend.run(prepared, c, inputs)
    return inputs, prepared, res


def time_sdpa(c: AttentionConfig, inputs) -> float:
    """Median device time of torch's SDPA (its default backend choice) on the same problem, 10 calls."""
    import torch
    import torch.nn.functional as F

    q, k, v = (T._to_torch(inputs[n], "cuda") for n in ("q", "k", "v"))
    kw = dict(is_causal=c.causal, enable_gqa=c.num_heads_q != c.num_heads_kv)
    F.scaled_dot_product_attention(q, k, v, **kw)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        F.scaled_dot_product_attention(q, k, v, **kw)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    return float(np.median(times))


def jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "hostemu"])
    ap.add_argument("--random", type=int, default=300)
    ap.add_argument("--defect-random", type=int, default=150)
    ap.add_argument("--skip-compile-all", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"backend": args.backend}
    records = open(out / "configs.jsonl", "w")
    t_start = time.perf_counter()
    cache_dir = out.parent / "kcache-evidence" if args.backend == "hostemu" else Path("/tmp/attn-kcache")
    cache = KernelCache(cache_dir, enabled=True)

    def log(*a):
        print(f"[{time.perf_counter() - t_start:7.1f}s]", *a, flush=True)

    backend = make_backend(args.backend, cache=cache)
    info = backend.device_info()
    summary["device_info"] = info.__dict__
    log("device", info)

    # 1. compile every variant (and each defect once), cold then from the disk cache.
    if not args.skip_compile_all and args.backend == "cuda":
        buckets = (*HEAD_DIM_BUCKETS, GENERAL_BUCKET)
        variants = [Variant(dt, a, b) for dt in ("f16", "bf16", "f32", "i8") for a in buckets for b in buckets]
        variants += [Variant("f16", 128, 128, defects=(d,)) for d in sorted(DEFECTS)]
        times, errors = [], []
        for v in variants:
            opts = backend.compile_options(v)
            try:
                r = cache.load_or_compile(v.name, backend.cache_key_fields(v, opts), lambda: backend._rt_compile(v, opts))
                mod = backend._rt_load(r.compiled)
                for expr in v.name_expressions:
                    backend._rt_get_function(mod, r.compiled.lowered_names[expr])
                times.append(r.compile_s)
            except Exception as exc:  # record and go on: the summary says which
                errors.append({"variant": v.name, "error": repr(exc), "log": getattr(exc, "log", "")[:3000]})
        t0 = time.perf_counter()
        hits = sum(cache.load_or_compile(v.name, backend.cache_key_fields(v, backend.compile_options(v)),
                                         lambda: (_ for _ in ()).throw(RuntimeError("miss"))).hit
                   for v in variants if v.name not in {e["variant"] for e in errors})
        summary["compile_all"] = {
            "variants": len(variants), "errors": errors, "compile_s_total": sum(times),
            "compile_s_median": float(np.median(times)) if times else None,
            "compile_s_max": max(times) if times else None,
            "cache_hits_second_pass": hits, "cache_second_pass_s": time.perf_counter() - t0,
        }
        log("compile_all", {k: v for k, v in summary["compile_all"].items() if k != "errors"}, "errors:", len(errors))

    # 2. correctness matrix: one config per feature x dtype, then random draws.
    configs = [("case", c) for c in T.CASES]
    n_random = args.random if args.backend == "cuda" else min(args.random, 8)
    max_cost = 3e8 if args.backend == "cuda" else 2e5
    configs += [("random", c) for c in T.random_configs(n_random, seed=20261203, max_cost=max_cost)]
    if args.backend == "hostemu":
        configs = [(k, c) for k, c in configs if c.g * c.num_heads_q * c.seq_len_q * c.split_kv <= 64
                   and c.seq_len_k <= 400][:20]
    fails_total, errors_total, worst = 0, 0, {}
    for kind, c in configs:
        rec = {"kind": kind, "config": json.loads(c.to_json())}
        try:
            inputs, prepared, res = run_one(backend, c)
            fails, metrics = T.check_run(c, inputs, res, prepared.block_n)
            rec.update(variant=prepared.variant, run_s=res.run_s, fails=fails,
                       metrics={k: jsonable(v) for k, v in metrics.items()},
                       partial_bytes=backend.last_alloc.get("o_part", 0) + backend.last_alloc.get("lse_part", 0),
                       splitkv_extra_bytes=splitkv_extra_bytes(c))
            if rec["partial_bytes"] != rec["splitkv_extra_bytes"]:
                fails.append("partial bytes != splitkv_extra_bytes")
            fails_total += bool(fails)
            for key in ("out_row_err", "lse_max_abs", "partials_row_err", "out_rms"):
                val = metrics.get(key)
                if val is not None and np.isfinite(val):
                    w = worst.setdefault(c.dtype, {})
                    w[key] = max(w.get(key, 0.0), float(val))
        except Exception as exc:
            errors_total += 1
            rec["error"] = repr(exc)
            rec["traceback"] = traceback.format_exc()[-3000:]
        records.write(json.dumps(rec, default=jsonable) + "\n")
        if rec.get("fails") or rec.get("error"):
            log("FAIL", kind, c.to_json(), rec.get("fails"), rec.get("error"))
    summary["matrix"] = {"configs": len(configs), "failed": fails_total, "errors": errors_total,
                         "worst_by_dtype": worst}
    log("matrix", summary["matrix"])

    # 3. defects: the dedicated case, then how many random configs each defect breaks.
    summary["defects"] = {}
    defect_pool = T.random_configs(args.defect_random if args.backend == "cuda" else 4, seed=7,
                                   max_cost=1e8 if args.backend == "cuda" else 1e5)
    for defect in sorted(DEFECTS):
        b = make_backend(args.backend, {defect}, cache=cache)
        entry = {}
        try:
            c = T.DEFECT_CASES[defect]
            inputs, prepared, res = run_one(b, c)
            fails, m = T.check_run(c, inputs, res, prepared.block_n)
            entry["case"] = {"config": json.loads(c.to_json()), "caught": bool(fails), "fails": fails,
                             "out_nan": int(np.isnan(res.out.astype(np.float32)).sum())}
            caught = applicable = 0
            for c in defect_pool:
                relevant = {"no_neginf_guard": c.split_kv > 1 and c.causal,
                            "floor_blocks_per_split": c.split_kv > 1,
                            "no_zero_sum_guard": c.split_kv > 1,
                            "causal_off_by_one": c.causal}[defect]
                if not relevant:
                    continue
                inputs, prepared, res = run_one(b, c)
                applicable += 1
                caught += bool(T.check_run(c, inputs, res, prepared.block_n)[0])
            entry["random"] = {"relevant_configs": applicable, "caught": caught}
        except Exception as exc:
            entry["error"] = repr(exc)
            entry["traceback"] = traceback.format_exc()[-3000:]
        summary["defects"][defect] = entry
        log("defect", defect, entry.get("case", {}).get("caught"), entry.get("random"), entry.get("error", ""))

    # 4. torch SDPA, an oracle nobody here wrote.
    if args.backend == "cuda":
        sd = []
        for c in T.SDPA_CASES:
            try:
                from reference import make_inputs

                inputs = make_inputs(c)
                ours = backend.run(backend.prepare(c), c, inputs).out.astype(np.float32)
                theirs = T.sdpa_reference(c, inputs)
                err = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-6))
                sd.append({"config": json.loads(c.to_json()), "rel_err_vs_sdpa": err})
            except Exception as exc:
                sd.append({"config": json.loads(c.to_json()), "error": repr(exc),
                           "traceback": traceback.format_exc()[-2000:]})
        summary["sdpa"] = sd
        log("sdpa", sd)

    # 5. timing (device time of the launches, median of 5) on shapes of GPU-NOTES, checked against SDPA.
    if args.backend == "cuda" and not args.skip_timing:
        shapes = [  # (g, Hq, Hkv, Sq, Sk, D, split_kv, causal)
            (8, 32, 8, 1, 4096, 128, 1, False), (8, 32, 8, 1, 4096, 128, 8, False),
            (1, 8, 1, 1, 65536, 128, 1, False), (1, 8, 1, 1, 65536, 128, 64, False),
            (1, 8, 1, 1, 65536, 128, 128, False),
            (1, 32, 32, 2048, 2048, 128, 1, True), (1, 32, 32, 2048, 2048, 128, 4, True),
        ]
        tim = []
        for g, hq, hkv, sq, sk, d, s, causal in shapes:
            c = AttentionConfig(dtype="f16", g=g, seq_len_q=sq, seq_len_k=sk, num_heads_q=hq, num_heads_kv=hkv,
                                head_dim_qk=d, head_dim_v=d, causal=causal, split_kv=s, return_lse=s > 1)
            try:
                from reference import make_inputs

                inputs = make_inputs(c)
                p = backend.prepare(c)
                runs = [backend.run(p, c, inputs) for _ in range(5)]
                secs = float(np.median([r.run_s for r in runs]))
                theirs = T.sdpa_reference(c, inputs)
                err = float(np.abs(runs[0].out.astype(np.float32) - theirs).max() / np.abs(theirs).max())
                nbytes = 2 * (g * hq * sq * d * 2 + g * hkv * sk * d * 2)
                sdpa_s = time_sdpa(c, inputs)
                tim.append({"shape": [g, hq, hkv, sq, sk, d], "split_kv": s, "causal": causal,
                            "run_us": secs * 1e6, "GBps": nbytes / secs / 1e9, "rel_err_vs_sdpa": err,
                            "torch_sdpa_us": sdpa_s * 1e6, "slowdown_vs_sdpa": secs / sdpa_s})
            except Exception as exc:
                tim.append({"shape": [g, hq, hkv, sq, sk, d], "split_kv": s, "error": repr(exc)})
            log("timing", tim[-1])
        summary["timing"] = tim

    summary["elapsed_s"] = time.perf_counter() - t_start
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=jsonable))
    records.close()
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
