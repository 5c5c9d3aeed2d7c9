"""What tools/tune_grouped.py and tools/tune_mma.py share: decode (or prefill) cases and their inputs on the
GPU, a backend that compiles with extra -D macros (or another variant) on a forced kernel path,
and the timing of one setting (µs per shape, geometric mean of effective TB/s)."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kernels import Ours, Timer, decode_case, make_inputs, prefill_case  # noqa: E402
from kernels.autosplit import choose_split_kv, replace_split  # noqa: E402


class DecodeBench:
    """Decode `shapes` in each of `dtypes`, their inputs made once, timed `iters` times."""

    def __init__(self, shapes: list[tuple[int, ...]], dtypes: list[str], iters: int, prefill: bool = False,
                 prefill_dims: tuple[int, ...] = (128,)):
        import torch

        self.timer = Timer(torch, iters)
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        # prefill: bench/kernels.py's two prefill cases (causal and not) at each head dim, in TFLOP/s
        self.prefill = prefill
        self.cases = ([prefill_case(dt, causal, d) for dt in dtypes for d in prefill_dims for causal in (False, True)]
                      if prefill
                      else [decode_case(s, dt) for dt in dtypes for s in shapes])
        if len(dtypes) > 1:
            for c in self.cases:
                c.name = f"{c.config.dtype} {c.name}"
        self.inputs = {c.name: make_inputs(torch, c.config) for c in self.cases}

    def measure(self, setting: dict[str, Any], defines: list[str], path: str,
                variant_map: Callable[[Any], Any] | None = None, **split_kw: Any) -> dict[str, Any]:
        """Time every case compiled with `defines` on `path` (its variant passed through
        `variant_map` when given), at the automatic split (choose_split_kv with `split_kw`);
        prints and returns `setting` with the times."""
        from kernels.cache import KernelCache
        from kernels.backends.cuda import CudaBackend

        class Tuned(CudaBackend):
            def compile_options(self, variant):
                return [*super().compile_options(variant), *defines]

            def variant_for(self, config):
                v = super().variant_for(config)
                return variant_map(v) if variant_map else v

        backend = Tuned(cache=KernelCache(enabled=False))
        backend.kernel_path = path
        try:
            ours = Ours(backend)
            times = {}
            for case in self.cases:
                kw = dict(split_kw)
                if variant_map:
                    v = backend.variant_for(case.config)
                    kw.setdefault("blocks_per_sm", v.blocks_per_sm)
                    kw.setdefault("tile_keys", v.tile_n or None)
                split = choose_split_kv(case.config, self.sms, mma=path == "mma", **kw)
                times[case.name] = self.timer(ours.runner(replace_split(case.config, split), self.inputs[case.name]))
        finally:
            backend.close()
        work = {c.name: c.flops if self.prefill else c.bytes for c in self.cases}
        gm = math.exp(sum(math.log(work[c.name] / times[c.name]) for c in self.cases) / len(self.cases)) / 1e12
        unit = "TFLOP/s" if self.prefill else "TB/s"
        label = " ".join(f"{k}={v}" for k, v in setting.items())
        print(f"{label}: geomean {gm:.2f} {unit}  " + "  ".join(f"{k} {v * 1e6:.0f}us" for k, v in times.items()),
              flush=True)
        return {**setting, f"geomean_{unit.replace('/', 'p')}": gm, "us": {k: v * 1e6 for k, v in times.items()}}
