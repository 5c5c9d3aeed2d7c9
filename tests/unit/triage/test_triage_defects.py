"""Every defect switch the cpu emulation runs, planted in a sampled sweep: one bug comes out as
one cluster (two at most: two symptoms the explanations do not unite) whose explanation names
the defect's trigger, located at the combine for the combine kernel's defects; its reproducer
shrinks to a small config within 200 runs and fails every time, whatever the data (a defect the
data trigger, DATA_DEFECTS: on the data that reach it)."""
from __future__ import annotations

import json

import pytest

from kernels.backends.base import COMBINE_DEFECTS, DATA_DEFECTS, DEFECTS, FAULT_DEFECTS, GPU_ONLY_DEFECTS
from store.db import session_scope
from tests.unit.triage.sweeps import defect_sweep
from triage.sweep import triage_sweep

CPU_DEFECTS = [d for d in DEFECTS if d not in GPU_ONLY_DEFECTS]
# The condition each defect needs (kernels/defects.py DEFECTS), as triage/features.py names it.
TRIGGERS = {
    "no_neginf_guard": {"masked_split"},
    "floor_blocks_per_split": {"split_kv>blocks", "blocks%split_kv!=0"},
    "no_zero_sum_guard": {"empty_split"},
    "causal_off_by_one": {"causal=true"},
    "oob_store": {"split_kv>1"},
    "oob_store_small": {"split_kv>1"},
    "hang": {"split_kv>1"},
    "combine_no_max_shift": {"logit_scale>="},   # a threshold on the inputs' logit scale
}
# Fault defects cost a process (oob_store) or a time limit (hang) per failing config: fewer samples.
SAMPLES = {d: 40 if d in FAULT_DEFECTS else 150 for d in CPU_DEFECTS}
HANG_LIMIT_S = 0.5


def test_every_cpu_defect_has_a_trigger():
    assert set(TRIGGERS) == set(CPU_DEFECTS)


@pytest.mark.parametrize("defect", CPU_DEFECTS)
def test_a_planted_defect_is_one_explained_cluster_with_a_small_deterministic_reproducer(defect, sqlite_url):
    limit = HANG_LIMIT_S if defect == "hang" else None
    sweep_id = defect_sweep(sqlite_url, defect, SAMPLES[defect], time_limit_s=limit)
    with session_scope(sqlite_url) as s:
        clusters = triage_sweep(s, sweep_id, time_limit_s=limit or 30.0, max_runs=200, max_seconds=60)
    report = [c.to_dict() for c in clusters]
    print(f"\n{defect}: " + json.dumps([{k: c[k] for k in ("size", "signatures", "shrink_runs")}
                                       | {"explanation": c["explanation"]["summary"],
                                          "class": c["classification"]["kind"],
                                          "minimal": {k: v for k, v in c["minimal_config"].items()
                                                      if k in ("dtype", "g", "seq_len_q", "seq_len_k", "num_heads_q",
                                                               "num_heads_kv", "head_dim_qk", "head_dim_v", "split_kv",
                                                               "causal", "return_lse")}} for c in report]))
    assert 1 <= len(clusters) <= 2
    # The combine's defects are located there whatever family ran them; the split kernels'
    # numeric defects (wrong partials) stay at their family.
    assert {c.signature.location for c in clusters} == ({"combine"} if defect in COMBINE_DEFECTS else {"cpu"})
    named = [t for t in TRIGGERS[defect] for cond in clusters[0].explanation.conditions
             if cond == t or (t.endswith(">=") and cond.startswith(t))]
    assert named, clusters[0].explanation.text
    if defect in COMBINE_DEFECTS:   # and the combine runs only with splits
        assert {"split_kv>1", "split_kv>blocks", "empty_split"} & set(clusters[0].explanation.conditions)
    assert clusters[0].explanation.recall >= 0.9 and clusters[0].explanation.precision >= 0.9
    # A data-triggered defect shrunk to one key fails on the data seeds whose logit passes exp's range.
    kinds = {"deterministic", "data_dependent"} if defect in DATA_DEFECTS else {"deterministic"}
    assert clusters[0].classification.kind in kinds, clusters[0].classification
    for i, c in enumerate(clusters):
        m = c.minimal_config
        assert c.shrink_runs <= 200
        # A second symptom may need more keys: floor_blocks_per_split's wrong (not NaN) output
        # needs a block the floored splits drop after others they keep: 3 blocks for 2 splits.
        assert m["seq_len_k"] <= (64 if i == 0 else 96) and m["g"] <= 2, m
        assert m["num_heads_q"] <= 2 and m["num_heads_kv"] <= 2, m
        assert m["head_dim_qk"] <= 16 and m["head_dim_v"] <= 16, m
        assert c.classification.kind in ("deterministic", "data_dependent"), c.classification
