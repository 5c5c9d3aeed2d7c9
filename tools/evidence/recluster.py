"""A GPU sweep with a defect switch, replayed on the cpu emulation and clustered as the GPU's
results would be: the emulation runs the kernels' split arithmetic (block_n 32 on every path),
and each result is named by the variant an H100 runs for its config (kernels.select with the
mma path), so triage sees the GPU's kernel families.

The configs are the sweep's own: the same seed, sample count and split-KV budget (the H100's
memory), so the sampler draws the same configs. With --gpu-triage (a triage.jsonl of
tools/evidence/gpu_call.sh), the failing configs are compared with the GPU's by content hash.
Prints the outcomes, the comparison and the clusters (triage.cluster; no shrinking).

    python3 tools/evidence/recluster.py --defect floor_blocks_per_split \\
        --gpu-triage DIR/gpu-2026-12-06-h100-bounds-64/triage.jsonl

(DIR: where docs/evidence/gpu-2026-12-06-h100-bounds-64.tar.xz is unpacked.)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from kernels.backends.cpu import CpuEmulationBackend  # noqa: E402
from kernels.select import select_variant  # noqa: E402
from sweeps.filters import splitkv_budget  # noqa: E402
from sweeps.runner import run_config  # noqa: E402
from sweeps.sampler import sample  # noqa: E402
from sweeps.spec import SweepSpec  # noqa: E402
from triage.cluster import ResultRow, cluster_results  # noqa: E402

H100_MIB = 81559


class H100Names(CpuEmulationBackend):
    """The cpu emulation, its results named by the variant an H100 runs for the config."""

    def prepare(self, config):
        return dataclasses.replace(super().prepare(config), variant=select_variant(config, self.defects, mma=True).name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--defect", required=True)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--memory-mib", type=int, default=H100_MIB, help="the GPU's memory (the split-KV budget)")
    ap.add_argument("--gpu-triage", type=Path, help="triage.jsonl with a line for --defect")
    a = ap.parse_args()

    spec = SweepSpec(samples=a.samples, seed=a.seed, backend="cuda")
    configs = sample(spec, splitkv_budget(a.memory_mib << 20, None)).configs
    backend = H100Names(frozenset({a.defect}))
    start = time.time()
    rows = [ResultRow.of(run_config(c, backend)) for c in configs]
    print(f"{a.defect}: {len(rows)} configs (seed {a.seed}) on the cpu emulation in {time.time() - start:.0f} s: "
          + ", ".join(f"{k} {n}" for k, n in sorted(Counter(r.outcome for r in rows).items())))
    failing = {r.config.content_hash() for r in rows if r.signature.failing}
    if a.gpu_triage:
        lines = [json.loads(x) for x in a.gpu_triage.read_text().splitlines() if x.strip()]
        gpu = next((x["triage"] for x in lines if x["defect"] == a.defect), None)
        if gpu is None:
            print(f"{a.gpu_triage}: no triage of {a.defect}")
        else:
            theirs = {h for c in gpu["clusters"] for h in c["config_hashes"]}
            print(f"failing: {len(failing)} here, {len(theirs)} on the GPU, {len(failing & theirs)} the same configs; "
                  f"GPU only {len(theirs - failing)}, here only {len(failing - theirs)}")
    clusters = cluster_results(rows)
    print(f"{len(clusters)} cluster(s)")
    for c in clusters:
        print(f"  {c.size:4}  {json.dumps(c.signatures)}\n        {c.explanation.describe()}")


if __name__ == "__main__":
    main()
