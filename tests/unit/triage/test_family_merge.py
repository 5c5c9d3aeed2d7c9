"""A bug in code every kernel family runs (the split ranges, the causal shift) is one cluster,
though each family's failures are a signature group of their own; so is a fault that no detail
places in the combine; two bugs, each in other families, stay two.

The GPU backends name a result's variant, and so its family, by kernels.select; the cpu
emulation runs the same split arithmetic (block_n 32 on every path) under one name. Here the
emulation reports the variant an H100 would run (tools/evidence/recluster.py H100Names, which
replays GPU sweeps the same way), so its results carry the families a GPU sweep's do: an H100 sweep with floor_blocks_per_split
(docs/evidence/gpu-2026-12-06-h100-bounds-64.tar.xz) split into five clusters by family and symptom
before families were joined.
"""
from __future__ import annotations

from attnconfig import parse_config
from kernels.select import select_variant
from sweeps.runner import run_config
from sweeps.sampler import sample
from sweeps.spec import SweepSpec
from tests.unit.triage.sweeps import RANGES
from tools.evidence.recluster import H100Names
from triage.attempt import Runner
from triage.cluster import Cluster, ResultRow, cluster_results, rerun_cost
from triage.signature import family_of
from triage.sweep import triage_clusters


def _configs(samples: int = 240):
    return sample(SweepSpec(samples=samples, seed=5, backend="cpu", ranges=RANGES), 1 << 30).configs


def _rows(backend_of) -> list[ResultRow]:
    return [ResultRow.of(run_config(c, backend_of(c))) for c in _configs()]


def test_a_bug_in_the_shared_split_ranges_is_one_cluster_across_families():
    backend = H100Names(frozenset({"floor_blocks_per_split"}))
    rows = _rows(lambda c: backend)
    failing = [r for r in rows if r.signature.failing]
    by_group = {r.signature for r in failing}
    # What each family sees of it: several signature groups in more than one family.
    assert len({family_of(r.variant) for r in failing}) >= 2 and len(by_group) >= 3, by_group
    clusters = cluster_results(rows)
    assert len(clusters) == 1, [(c.signatures, c.explanation.text) for c in clusters]
    bug = clusters[0]
    assert bug.size == len(failing)
    assert {"blocks%split_kv!=0", "split_kv>blocks"} & set(bug.explanation.conditions), bug.explanation.text
    assert len({label.rsplit("/", 1)[1] for label in bug.signatures}) >= 2   # the families it spans show


def test_two_bugs_in_different_families_stay_two():
    # The masking bug in the rowwise kernels, the split-size bug in the others.
    causal = H100Names(frozenset({"causal_off_by_one"}))
    floor = H100Names(frozenset({"floor_blocks_per_split"}))

    def backend_of(c):
        return causal if family_of(select_variant(c, (), mma=True).name) == "rowwise" else floor

    rows = _rows(backend_of)
    failing = [r for r in rows if r.signature.failing]
    assert {family_of(r.variant) for r in failing} >= {"rowwise", "grouped"}
    clusters = cluster_results(rows)
    texts = [c.explanation.text for c in clusters]
    masking = [c for c in clusters if "causal=true" in c.explanation.conditions]
    splits = [c for c in clusters if {"blocks%split_kv!=0", "split_kv>blocks"} & set(c.explanation.conditions)]
    assert masking and splits and not set(map(id, masking)) & set(map(id, splits)), texts
    # Neither took the other's failures: each cluster holds one family side.
    for c in clusters:
        sides = {family_of(r.variant) == "rowwise" for r in c.members}
        assert len(sides) == 1, (c.explanation.text, c.signatures)


def test_a_fault_no_detail_attributes_is_one_cluster_across_families():
    # A GPU's illegal address is reported at the synchronize after both launches and names no
    # kernel, so each fault stays at its family (triage/signature.py); the stray store of
    # oob_store_small, its details dropped, stands in for it.
    backend = H100Names(frozenset({"oob_store_small"}))
    rows = [ResultRow(r.config, r.outcome, r.failed_gate, r.variant, r.block_n) for r in _rows(lambda c: backend)]
    faults = [r for r in rows if r.outcome == "fault"]
    assert len({r.signature.location for r in faults}) >= 2 and "combine" not in {r.signature.location for r in faults}
    clusters = cluster_results(rows)
    assert len(clusters) == 1 and clusters[0].size == len(faults), [c.signatures for c in clusters]
    assert clusters[0].explanation.conditions == ["split_kv>1"], clusters[0].explanation.text


def test_a_cluster_across_families_is_shrunk_from_a_member_of_its_own_signature():
    # The cluster's own signature is one family's; its cheapest member may have failed in
    # another. Shrinking starts from the cheapest member that failed with the cluster's own
    # signature, so the reproducer fails as the bug is named, and the triage checks it does.
    backend = H100Names(frozenset({"floor_blocks_per_split"}))
    rows = _rows(lambda c: backend)
    [joined] = cluster_results(rows)
    # The members of the cluster's own family that are cheaper than another family's cheapest
    # left out, so the cheapest member failed elsewhere.
    other = Cluster(joined.signature, [r for r in joined.members if r.signature != joined.signature],
                    joined.explanation).example()
    members = [r for r in joined.members if r.signature != joined.signature or rerun_cost(r.config) > rerun_cost(other.config)]
    bug = Cluster(joined.signature, members, joined.explanation)
    assert min(members, key=lambda r: rerun_cost(r.config)) is other and other.signature != bug.signature
    example = bug.example()
    assert example.signature == bug.signature and rerun_cost(example.config) > rerun_cost(other.config)
    runner = Runner(factory=lambda: backend, time_limit_s=None)
    triage_clusters([bug], runner, max_runs=60, max_seconds=60, seeds=(1,))
    shrunk = parse_config(bug.minimal_config)
    assert shrunk.seq_len_k * shrunk.g <= example.config.seq_len_k * example.config.g
    assert runner.run(shrunk).signature == bug.signature == bug.reproducer_signature
    assert bug.classification.kind in ("deterministic", "data_dependent"), bug.classification
    assert bug.classification.same_input_failing == bug.classification.repeats


class _ExclusiveKvLength(H100Names):
    """A kernel bug no defect switch has: the KV-cache length (current_seq_len, inclusive) read
    as exclusive, so each entry's last valid key is dropped, on every kernel family."""

    def run(self, prepared, config, inputs):
        if config.current_seq_len is not None:
            config = config.model_copy(update={"current_seq_len": [x - 1 for x in config.current_seq_len]})
        return super().run(prepared, config, inputs)


def test_family_groups_that_share_the_condition_that_explains_them_are_one_bug():
    # Each family shows the bug under current_seq_len=true and a second condition of its own
    # (how its failures come to show: short keys on the grouped path, i8 on the rowwise one);
    # split by family before, these were "current_seq_len=true and seq_len_k<=16" and
    # "current_seq_len=true and dtype=i8".
    configs = sample(SweepSpec(samples=150, seed=1, backend="cpu", ranges={**RANGES, "seq_len_k": [1, 1024]}),
                     1 << 30).configs
    backend = _ExclusiveKvLength(frozenset())
    rows = [ResultRow.of(run_config(c, backend)) for c in configs]
    failing = [r for r in rows if r.signature.failing]
    assert all(r.config.current_seq_len is not None for r in failing)
    assert {family_of(r.variant) for r in failing} >= {"grouped", "rowwise"}
    [bug] = cluster_results(rows)
    assert bug.size == len(failing) and "current_seq_len=true" in bug.explanation.conditions, bug.explanation.text
