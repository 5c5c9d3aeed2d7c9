"""A sweep's failures grouped into clusters, one per bug as far as the results can tell.

Failures are grouped by signature (triage/signature.py) and each group is explained
(triage/explain.py). One bug often shows more than one symptom, e.g. `fail` on the rms gate
for most configs and `nan` on the lse gate for some. A smaller group is that bug's other
symptom, and joins a larger one, when
- at least MERGE_SHARE of its members satisfy the larger group's explanation, or
- one condition of either group's explanation (or the smaller group's whole explanation)
  holds for MERGE_SHARE of each group's members, and MERGE_SHARE of the configs it holds for
  are their members: floored split sizes give NaN where every split is empty
  (`split_kv>blocks`) and a wrong output where only the tail's keys are lost, and
  `blocks%split_kv!=0` explains both, though a few members of the second fit a conjunction
  (`blocks%split_kv!=0 and dtype=i8`) better; or
- (at the same location only) the two together are explained at least as well (F1) as the
  smaller group alone: no condition separates it from the larger one better than one that fits
  both, as with a race whose `fail` and `nan` configs are two random draws from the same
  configs (split_kv > 1).
The location is a kernel family or `combine`. Groups in different kernel families join by the
first two rules (the first needing a condition): every family's split kernel runs the same
split ranges and causal shift (attention.hip attn_split_range, attn_causal_shift), so a bug
there fails in each family under one trigger, with the symptoms each family's data and tiles
give it (an H100 sweep with floored split sizes made five clusters by family and symptom).
`combine` and a result without a family join nothing elsewhere: the partials already told
those apart.
Two bugs with conditions of their own (causal, a dtype) stay apart: no conjunction covers both
without the passing configs between them. The merged cluster keeps the larger group's
signature and counts every signature it holds (so the families it spans show); its
explanation is searched again over all its members before the next group is compared with it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from attnconfig import AttentionConfig
from sweeps.result import ConfigResult
from triage.explain import Explanation, explain, holds
from triage.features import facts
from triage.signature import COMBINE, NO_FAMILY, Signature, location_of

MERGE_SHARE = 0.9


@dataclass(frozen=True)
class ResultRow:
    """One judged config as a sweep stored it (or a runner returned it)."""

    config: AttentionConfig
    outcome: str
    failed_gate: str | None = None
    variant: str | None = None
    block_n: int | None = None
    # What locates a failure in the combine (triage.signature.location_of): the metrics of
    # docs/spec.md §4, the gates it was judged by, and its detail. None: it stays at its family.
    metrics: Mapping[str, Any] | None = None
    gates: Mapping[str, Any] | None = None
    detail: str | None = None

    @classmethod
    def of(cls, result: ConfigResult) -> ResultRow:
        """The row of a result as the runner returned it (sweeps.runner.run_config)."""
        return cls(result.config, result.outcome, result.failed_gate, result.variant, result.block_n,
                   result.metrics, result.gates, result.detail)

    @property
    def signature(self) -> Signature:
        return Signature(self.outcome, self.failed_gate, location_of(self.config, self.outcome, self.failed_gate,
                                                                     self.variant, self.metrics, self.gates, self.detail))


def rerun_cost(c: AttentionConfig) -> int:
    """The size of a config's problem, by which a cluster's cheapest member is chosen."""
    return c.g * c.num_heads_q * c.seq_len_q * c.seq_len_k * (c.head_dim_qk + c.head_dim_v) * c.split_kv


@dataclass
class Cluster:
    signature: Signature
    members: list[ResultRow]
    explanation: Explanation
    signatures: dict[str, int] = field(default_factory=dict)   # label -> members with it
    minimal_config: dict[str, Any] | None = None
    shrink_runs: int | None = None
    classification: Any = None            # triage.classify.Classification
    first_bad_commit: str | None = None
    reproducer: str | None = None         # the command line that runs minimal_config as the sweep did
    reproducer_signature: Signature | None = None   # what the reproducer gave when run after it was made

    @property
    def size(self) -> int:
        return len(self.members)

    def example(self) -> ResultRow:
        """The member that is cheapest to run again among those that failed with the cluster's
        own signature (shrinking starts there, so the reproducer fails as the bug is named):
        the smallest problem."""
        named = [r for r in self.members if r.signature == self.signature] or self.members
        return min(named, key=lambda r: (rerun_cost(r.config), r.config.content_hash()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "signature": self.signature.to_dict(),
            "signatures": dict(self.signatures),
            "explanation": self.explanation.to_dict(),
            "example_config": self.example().config.to_dict(),
            "minimal_config": self.minimal_config,
            "shrink_runs": self.shrink_runs,
            "classification": self.classification.to_dict() if self.classification is not None else None,
            "first_bad_commit": self.first_bad_commit,
            "reproducer": self.reproducer,
            "reproducer_signature": self.reproducer_signature.to_dict() if self.reproducer_signature else None,
            "runs": (self.shrink_runs or 0) + (self.classification.runs if self.classification is not None else 0),
            "config_hashes": [r.config.content_hash() for r in self.members],
        }


def cluster_results(rows: Sequence[ResultRow]) -> list[Cluster]:
    """Clusters of the failing rows, largest first; passing rows are what explanations contrast with."""
    facts_of = {id(r): facts(r.config, r.block_n) for r in rows}
    passing = [facts_of[id(r)] for r in rows if r.outcome == "pass"]
    groups: dict[Signature, list[ResultRow]] = {}
    for r in rows:
        if r.signature.failing:
            groups.setdefault(r.signature, []).append(r)

    def make(sig: Signature, members: list[ResultRow]) -> Cluster:
        return Cluster(sig, members, explain([facts_of[id(r)] for r in members], passing),
                       dict(Counter(r.signature.label() for r in members)))

    def covered(conditions: Sequence[str], configs: list[dict[str, Any]]) -> int:
        return sum(holds(conditions, f) for f in configs)

    def fits_both(conditions: Sequence[str], a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
        """Whether the conditions hold for MERGE_SHARE of each group's facts (a, b) and MERGE_SHARE of
        the configs they hold for are the two groups' members."""
        in_a, in_b = covered(conditions, a), covered(conditions, b)
        if min(in_a / len(a), in_b / len(b)) < MERGE_SHARE:
            return False
        return (in_a + in_b) >= MERGE_SHARE * (in_a + in_b + covered(conditions, passing))

    def same_bug(host: Cluster, c: Cluster) -> bool:
        # Local: the host already holds failures of c's location (its own, or a family it joined).
        local = c.signature.location in {r.signature.location for r in host.members}
        if not (local or {host.signature.location, c.signature.location}.isdisjoint({COMBINE, NO_FAMILY})):
            return False
        hosts, members = [facts_of[id(r)] for r in host.members], [facts_of[id(r)] for r in c.members]
        if local or host.explanation.conditions:
            if covered(host.explanation.conditions, members) >= MERGE_SHARE * c.size:
                return True
        # One condition of either explanation, or the smaller group's whole one: a group of a few
        # members fits a conjunction that the bug's trigger is one half of.
        candidates = [[n] for e in (host.explanation, c.explanation) for n in e.conditions]
        if any(fits_both(conds, hosts, members) for conds in candidates + [c.explanation.conditions] if conds):
            return True
        shared = set(host.explanation.conditions) & set(c.explanation.conditions)
        if not (local or shared):
            return False
        union = explain(hosts + members, passing)
        # Across families, only a condition both explanations hold may join them: a bug in code
        # every family runs (a KV-cache length read as exclusive) shows in each family under the
        # shared condition and a second one of that family's own (how its failures come to show).
        return (local and union.f1 >= c.explanation.f1) or bool(shared & set(union.conditions))

    ordered = sorted((make(s, m) for s, m in groups.items()), key=lambda c: (-c.size, c.signature))
    kept: list[Cluster] = []
    for c in ordered:
        # Its own location first: a symptom of the bug there is likelier than a shared-code bug.
        order = sorted(range(len(kept)), key=lambda i: kept[i].signature.location != c.signature.location)
        i = next((i for i in order if same_bug(kept[i], c)), None)
        if i is None:
            kept.append(c)
        else:
            # Explained again at once: the next, smaller symptom is judged against what the bug's
            # symptoms so far have in common, not against the first group's own conditions.
            kept[i] = make(kept[i].signature, [*kept[i].members, *c.members])
    return kept
