"""Failures located at the split-KV combine, which every kernel family shares: a wrong output
over right partials, or a fault whose detail names the combine kernel. A combine bug is one
cluster explained by split_kv > 1, whatever family ran its configs; a split kernel's wrong
partials stay at their family."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from attnconfig import parse_config
from kernels.backends.cpu import CpuEmulationBackend
from reference import splits
from sweeps.policy import gates_for
from sweeps.runner import run_config
from sweeps.sampler import sample
from sweeps.spec import SweepSpec
from tests.unit.triage.sweeps import RANGES
from triage.attempt import Runner
from triage.cluster import ResultRow, cluster_results
from triage.shrink import shrink
from triage.signature import COMBINE, family_of, location_of

# Every result of a 300-config sweep with the missing_barrier race on an H100, with its metrics,
# gates and detail (docs/evidence/README.md, gpu-2026-12-06-h100-combine-location, says how it
# was made).
H100_RACE = Path(__file__).resolve().parent / "h100_missing_barrier_rows.json.gz"

BASE = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=1, num_heads_kv=1, head_dim_qk=8, head_dim_v=8)
SPLIT = parse_config({**BASE, "split_kv": 2, "return_lse": True})
GATES = gates_for(SPLIT)   # row 4e-3, lse 1e-3 (f16)
RIGHT_PARTIALS = {"partials_row_err": 1e-5, "partials_lse_max_abs": 1e-6, "partials_invalid_bad": 0,
                  "partials_nonfinite": 0}


class _WeightlessCombine(CpuEmulationBackend):
    """A combine that averages the splits' outputs instead of weighting each by exp(LSE_s - M):
    the emulation's partials (right), a wrong output wherever split_kv > 1."""

    def run(self, prepared, config, inputs):
        out = super().run(prepared, config, inputs)
        if out.o_partials is not None:
            out.out = out.o_partials.mean(axis=0).astype(out.out.dtype)
        return out


class _WrongSplit(CpuEmulationBackend):
    """A split kernel whose first split's output is 1.5 times too large (its LSE right), combined
    correctly: the partials are wrong, the combine is not."""

    def run(self, prepared, config, inputs):
        out = super().run(prepared, config, inputs)
        if out.o_partials is not None:
            out.o_partials[0] *= np.float32(1.5)
            o, _ = splits.combine_unmasked(out.o_partials, out.lse_partials)
            out.out = o.astype(out.out.dtype)
        return out


def _rows(backend: CpuEmulationBackend, samples: int = 60) -> list[ResultRow]:
    configs = sample(SweepSpec(samples=samples, seed=5, backend="cpu", ranges=RANGES), 1 << 30).configs
    return [ResultRow.of(run_config(c, backend)) for c in configs]


def test_the_evidence_that_locates_a_failure_in_the_combine():
    def at(config=SPLIT, outcome="fail", gate="rms", metrics=RIGHT_PARTIALS, gates=GATES, detail=None):
        return location_of(config, outcome, gate, "cpu_attn_f16_bn32_dqk8_dv8", metrics, gates, detail)

    assert at() == COMBINE
    assert at(outcome="nan", gate="lse") == COMBINE
    assert at(metrics={**RIGHT_PARTIALS, "partials_row_err": 4e-3}) == COMBINE     # bounds are inclusive
    # Partials that break a bound, hold a NaN, or were not exposed leave it at its family.
    assert at(metrics={**RIGHT_PARTIALS, "partials_row_err": 5e-3}) == "cpu"
    assert at(metrics={**RIGHT_PARTIALS, "partials_lse_max_abs": 0.01}) == "cpu"
    assert at(metrics={**RIGHT_PARTIALS, "partials_invalid_bad": 1}) == "cpu"
    assert at(outcome="nan", metrics={**RIGHT_PARTIALS, "partials_nonfinite": 3}) == "cpu"
    assert at(metrics={"out_rms": 0.5}) == "cpu" and at(metrics=None) == "cpu" and at(gates=None) == "cpu"
    assert at(gate="partials") == "cpu"
    # One split: no combine ran.
    one = parse_config({**BASE, "return_lse": True})
    assert at(config=one, metrics={**RIGHT_PARTIALS}, gates=gates_for(one)) == "cpu"
    # Faults and timeouts by what their detail names.
    guard = ("device fault in attn_f16_qk32_v32_n32_m1_t128_defect-oob_store_small: store outside o: 2 bytes of the "
             "guard after it changed, the nearest 2 bytes past its end (2-byte elements); attn_splitkv_combine is "
             "the one kernel of the call given o")
    assert at(outcome="fault", gate=None, metrics=None, detail=guard) == COMBINE
    assert at(outcome="timeout", gate=None, metrics=None,
              detail="exceeded the per-config time limit of 4 s\nstopped in attn_splitkv_combine (cpu emulation)") == COMBINE
    illegal = ("device fault in attn_bf16_qk32_v256_n32_m4_t128_grouped_defect-oob_store: kernel execution "
               "(cuEventSynchronize) failed: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
    assert location_of(SPLIT, "fault", None, "attn_bf16_qk32_v256_n32_m4_t128_grouped_defect-oob_store",
                       detail=illegal) == "grouped"
    both = "race in attn_splitkv_combine<__half, float, 256> and in attn_splitkv_fwd_grouped<__half, 64, 64, 32, 128, 4>"
    assert at(outcome="unsafe", gate=None, metrics=None, detail=both) == "cpu"


def test_a_combine_bug_is_one_cluster_at_the_combine_explained_by_split_kv():
    rows = _rows(_WeightlessCombine())
    failing = [r for r in rows if r.signature.failing]
    assert failing and all(r.config.split_kv > 1 for r in failing)
    assert {r.signature.location for r in failing} == {COMBINE}
    clusters = cluster_results(rows)
    assert len(clusters) == 1, [c.signatures for c in clusters]
    c = clusters[0]
    assert c.signature.location == COMBINE and c.size == len(failing)
    assert all(label.endswith("/combine") for label in c.signatures)
    assert "split_kv>1" in c.explanation.conditions, c.explanation.text
    assert c.explanation.recall >= 0.9 and c.explanation.precision >= 0.9
    assert c.to_dict()["signature"]["location"] == COMBINE


def test_wrong_partials_stay_at_the_family_that_computed_them():
    rows = _rows(_WrongSplit())
    failing = [r for r in rows if r.signature.failing]
    assert failing and all(r.config.split_kv > 1 for r in failing)
    # The output is wrong too (its rms gate decides first), but the partials are what broke.
    assert {r.signature.location for r in failing} == {"cpu"}
    assert {c.signature.location for c in cluster_results(rows)} == {"cpu"}


def test_triage_runs_locate_as_the_sweep_did_so_shrinking_keeps_the_combine():
    c = parse_config({**BASE, "g": 2, "num_heads_q": 2, "seq_len_k": 150, "split_kv": 4, "return_lse": True,
                      "data_seed": 3})
    runner = Runner(factory=_WeightlessCombine)
    first = runner.run(c)
    assert first.signature.location == COMBINE and first.signature.failing
    shrunk = shrink(c, runner, max_runs=80)
    # split_kv 1 has no combine to fail: the smallest config that fails there keeps 2 splits.
    assert shrunk.signature == first.signature and shrunk.minimal_config["split_kv"] == 2
    hang = Runner("cpu", {"hang"}, time_limit_s=0.3).run(SPLIT)
    assert hang.signature.label() == "timeout/-/combine", hang.detail


def test_the_h100_race_is_one_cluster_at_the_combine_and_one_without_the_metrics_that_locate_it():
    stored = json.loads(gzip.decompress(H100_RACE.read_bytes()))["rows"]
    rows = [ResultRow(parse_config(r["config"]), r["outcome"], r["failed_gate"], r["variant"], r["block_n"],
                      r["metrics"], r["gates"], r["detail"]) for r in stored]
    failing = [r for r in rows if r.signature.failing]
    # The race is in the combine: every failing config's partials are right, on all three paths.
    assert len(failing) == 85 and {r.signature.location for r in failing} == {COMBINE}
    assert {family_of(r.variant) for r in failing} == {"rowwise", "grouped", "mma"}
    clusters = cluster_results(rows)
    assert len(clusters) == 1, [c.signatures for c in clusters]
    race = clusters[0]
    assert race.size == 85 and race.signatures == {"nan/rms/combine": 62, "fail/rms/combine": 18, "fail/row/combine": 5}
    assert "split_kv>1" in race.explanation.conditions, race.explanation.text
    # Without the metrics that locate them, each family's failures are a group of their own, and
    # the draws give each its own second condition; the condition their explanations share
    # (empty_split) joins them all the same.
    by_family = cluster_results([ResultRow(r.config, r.outcome, r.failed_gate, r.variant, r.block_n) for r in rows])
    assert len({r.signature.location for c in by_family for r in c.members}) == 3
    assert len(by_family) == 1 and by_family[0].size == 85, [(c.size, c.explanation.text) for c in by_family]
