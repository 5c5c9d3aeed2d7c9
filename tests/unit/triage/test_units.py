"""Config facts, the explanation search, symptom merging and the classification of repeat runs."""
from __future__ import annotations

import numpy as np

from attnconfig import parse_config
from kernels.backends.cpu import CpuEmulationBackend
from triage.attempt import Runner
from triage.classify import classify
from triage.cluster import ResultRow, cluster_results
from triage.explain import explain
from triage.features import condition_holds, facts
from triage.signature import Signature, family_of

BASE = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=64, num_heads_q=1, num_heads_kv=1, head_dim_qk=8, head_dim_v=8)


def cfg(**changes):
    return parse_config({**BASE, **changes})


def test_split_facts_follow_the_kernels_block_arithmetic():
    three = facts(cfg(seq_len_k=65, split_kv=2, return_lse=True))          # 3 blocks of 32, 2 per split
    assert three["blocks"] == 3 and three["blocks%split_kv!=0"] and not three["split_kv>blocks"]
    assert not three["empty_split"]
    few = facts(cfg(seq_len_k=20, split_kv=4, return_lse=True))            # 1 block, 4 splits
    assert few["split_kv>blocks"] and few["empty_split"] and not few["masked_split"]
    causal = facts(cfg(seq_len_k=64, split_kv=2, return_lse=True, causal=True))  # row 0 cannot see split 1's block
    assert causal["masked_split"] and causal["empty_split"]
    assert not facts(cfg(seq_len_k=64, split_kv=2, return_lse=True))["empty_split"]
    assert condition_holds("not masked_split", few) and condition_holds("seq_len_k<=20", few)
    assert condition_holds("dtype=f16", few) and condition_holds("causal=false", few)


def test_the_explanation_is_the_condition_that_separates_failures_from_passes():
    rng = np.random.default_rng(0)
    rows = [cfg(seq_len_k=int(rng.integers(1, 200)), causal=bool(rng.integers(2)), dtype=str(rng.choice(["f16", "bf16"])))
            for _ in range(120)]
    # failing: bf16 and causal, with one passing exception
    failing = [f for f in map(facts, rows) if f["dtype"] == "bf16" and f["causal"]]
    passing = [f for f in map(facts, rows) if not (f["dtype"] == "bf16" and f["causal"])] + failing[-1:]
    e = explain(failing[:-1], passing)
    assert set(e.conditions) == {"dtype=bf16", "causal=true"}
    assert e.recall == 1.0 and 0.9 < e.precision < 1.0 and e.rate_outside == 0.0


def test_two_symptoms_of_one_condition_are_one_cluster():
    rows = [ResultRow(cfg(seq_len_k=k, causal=True), "fail" if k % 5 else "nan", "rms" if k % 5 else "lse", "cpu_attn")
            for k in range(1, 60)]
    rows += [ResultRow(cfg(seq_len_k=k), "pass", None, "cpu_attn") for k in range(1, 60)]
    clusters = cluster_results(rows)
    assert len(clusters) == 1 and clusters[0].size == 59
    assert clusters[0].explanation.conditions == ["causal=true"]
    assert clusters[0].signatures == {"fail/rms/cpu": 48, "nan/lse/cpu": 11}


def test_a_cluster_shrinks_from_a_member_with_its_own_signature():
    # The cheapest member (seq_len_k=5) failed as nan/lse; the cluster is named fail/rms, so its
    # reproducer must start from a fail/rms member, or it would fail other than announced.
    rows = [ResultRow(cfg(seq_len_k=k, causal=True), "fail" if k % 5 else "nan", "rms" if k % 5 else "lse", "cpu_attn")
            for k in range(5, 60)]
    rows += [ResultRow(cfg(seq_len_k=k), "pass", None, "cpu_attn") for k in range(1, 60)]
    [cluster] = cluster_results(rows)
    assert cluster.signature.label() == "fail/rms/cpu"
    assert min(cluster.members, key=lambda r: r.config.seq_len_k).signature.label() == "nan/lse/cpu"
    example = cluster.example()
    assert example.signature == cluster.signature and example.config.seq_len_k == 6


def test_families_are_kernel_paths():
    assert family_of("attn_f16_qk64_v64_n32_m4_t128_grouped_defect-hang") == "grouped"
    assert family_of("attn_f16_qk64_v64_n32_m16_t128_k64_b2_mma") == "mma"
    assert family_of("attn_f32_qk1024_v1024_n32_m1_t128") == "rowwise"
    assert family_of("cpu_attn_f16_bn32_dqk8_dv8") == "cpu" and family_of(None) == "-"


class _Noisy(CpuEmulationBackend):
    """A kernel whose output changes between runs of the same inputs by `scale` (a race, say)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale, self.calls = scale, 0

    def run(self, prepared, config, inputs):
        out = super().run(prepared, config, inputs)
        self.calls += 1
        out.out = (out.out.astype(np.float32) + self.scale * (self.calls % 2)).astype(out.out.dtype)
        return out


def test_classification_of_repeat_runs():
    c = cfg(seq_len_k=40)
    assert classify(c, Runner("cpu")).kind == "passes"
    # one ulp of f16 at 1: below every gate, but not the same bits
    assert classify(c, Runner(factory=lambda: _Noisy(1e-3))).kind == "nondeterministic"
    # every other run fails the rms gate
    assert classify(c, Runner(factory=lambda: _Noisy(1.0))).kind == "flaky"
    # a config that failed before (in the sweep, in the shrink) and now passes: a race
    passing = Runner("cpu")
    assert classify(c, passing, Signature("fail", "rms", "cpu"), failed_before=True).kind == "flaky"
    assert classify(c, passing, Signature("fail", "rms", "cpu")).kind == "passes"
    bug = Runner("cpu", {"causal_off_by_one"})
    result = classify(cfg(seq_len_k=40, causal=True), bug, repeats=3, seeds=(1, 2))
    assert result.kind == "deterministic" and result.same_input_failing == 3 and result.seeds_failing == [1, 2]
    assert bug.runs == result.runs == 5


def test_two_bugs_with_conditions_of_their_own_stay_two_clusters():
    # causal configs fail the rms gate, non-causal bf16 ones give NaN: no conjunction covers both
    # without the passing non-causal f16 configs, so neither is the other's symptom.
    rows = []
    for k in range(1, 121):
        c = cfg(seq_len_k=k, causal=k % 2 == 0, dtype="bf16" if k % 3 == 0 else "f16")
        outcome, gate = ("fail", "rms") if c.causal else ("nan", "lse") if c.dtype == "bf16" else ("pass", None)
        rows.append(ResultRow(c, outcome, gate, "cpu_attn"))
    clusters = cluster_results(rows)
    assert [(c.size, c.explanation.text) for c in clusters] == [(60, "causal=true"), (20, "dtype=bf16")]
