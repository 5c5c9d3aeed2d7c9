"""Which config conditions explain a cluster of failures: conjunctions of up to two predicates.

A good explanation holds for (nearly) every member of the cluster and for few of the configs
that passed: it is scored by F1 of recall (members it covers) and precision (members among
the configs it covers, members and passing ones; configs of other clusters count for neither,
as another bug's failures say nothing about this one). A second predicate is kept only when it
raises the score by more than COMPLEXITY_COST, and ties go to derived facts, then fields, then
thresholds: `causal=true` over `seq_len_q>=1 and causal=true`. A condition on the inputs'
data (the regime, the logit scale) costs DATA_COST: with the regimes mixed, a masking bug that a
sink's weight hides passes on sink inputs, and "causal=true" (28 of 32) says more to a kernel
engineer than "causal=true and logit_scale<=603" (28 of 28); a bug the data trigger (an exp
that overflows) gains far more than that from its condition.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any, Sequence

import numpy as np

from triage.features import Predicate, condition_holds, predicates

COMPLEXITY_COST = 0.02   # score a second predicate must add
PAIR_POOL = 40           # best single predicates whose pairs are searched
DATA_COST = 0.1          # score a condition on the inputs' data must add
_KIND_COST = {"derived": 0.0, "field": 0.001, "threshold": 0.002, "data": DATA_COST}


@dataclass(frozen=True)
class Explanation:
    conditions: list[str]        # the predicates, all of which hold
    members: int                 # cluster size
    covered: int                 # members where the conditions hold
    passing_covered: int         # passing configs where they hold
    passing: int                 # passing configs in all
    precision: float
    recall: float
    f1: float
    rate_inside: float           # members / (members + passing) where the conditions hold
    rate_outside: float          # the same where they do not

    @property
    def text(self) -> str:
        return " and ".join(self.conditions) if self.conditions else "(no condition separates it)"

    def describe(self) -> str:
        inside = self.covered + self.passing_covered
        outside = (self.members - self.covered) + (self.passing - self.passing_covered)
        return (f"{self.text}: fails {self.covered}/{inside} where it holds ({self.rate_inside:.0%}), "
                f"{self.members - self.covered}/{outside} elsewhere ({self.rate_outside:.0%})")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text, "summary": self.describe()}


def _f1(tp: np.ndarray, fp: np.ndarray, n_members: int) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), 0.0)
        recall = tp / max(n_members, 1)
        return np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0.0)


def explain(member_facts: Sequence[dict[str, Any]], passing_facts: Sequence[dict[str, Any]]) -> Explanation:
    """The best conjunction of at most two predicates separating members from passing configs."""
    preds: list[Predicate] = predicates([*member_facts, *passing_facts], member_facts)
    m = np.array([[p.test(f) for f in member_facts] for p in preds], dtype=bool).reshape(len(preds), len(member_facts))
    q = np.array([[p.test(f) for f in passing_facts] for p in preds], dtype=bool).reshape(len(preds), len(passing_facts))
    n = len(member_facts)
    tie = np.array([_KIND_COST[p.kind] for p in preds])
    single = _f1(m.sum(1), q.sum(1), n) - tie
    best_i = int(np.argmax(single))
    best: tuple[float, tuple[int, ...]] = (float(single[best_i]), (best_i,))
    pool = np.argsort(-single, kind="stable")[:PAIR_POOL]
    for i, j in combinations(sorted(pool.tolist()), 2):
        tp, fp = (m[i] & m[j]).sum(), (q[i] & q[j]).sum()
        score = float(_f1(np.array(tp), np.array(fp), n)) - tie[i] - tie[j] - COMPLEXITY_COST
        if score > best[0] + 1e-12:
            best = (score, (i, j))
    chosen = best[1]
    covered_m = np.logical_and.reduce([m[i] for i in chosen]) if n else np.zeros(0, bool)
    covered_q = np.logical_and.reduce([q[i] for i in chosen]) if len(passing_facts) else np.zeros(0, bool)
    return _summary([preds[i].name for i in chosen], int(covered_m.sum()), int(covered_q.sum()), n, len(passing_facts))


def _summary(conditions: list[str], tp: int, fp: int, members: int, passing: int) -> Explanation:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / members if members else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    outside_m, outside_q = members - tp, passing - fp
    return Explanation(conditions, members, tp, fp, passing, round(precision, 4), round(recall, 4), round(f1, 4),
                       round(precision, 4), round(outside_m / (outside_m + outside_q), 4) if outside_m + outside_q else 0.0)


def holds(conditions: Sequence[str], config_facts: dict[str, Any]) -> bool:
    """Whether a config's facts satisfy every one of the conditions (an explanation's, say)."""
    return all(condition_holds(name, config_facts) for name in conditions)
