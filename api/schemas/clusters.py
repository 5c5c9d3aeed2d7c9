"""GET /sweeps/{id}/clusters: a sweep's failures as bugs (its triage: triage/, store/clusters.py)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

TriageStatus = Literal["none", "pending", "running", "done", "failed"]


class SignaturePublic(BaseModel):
    outcome: str = Field(description="the failing outcome the cluster's members share (docs/spec.md §7)")
    gate: str | None = Field(description="the gate that decided it (rms, row, lse, ...); null when no gate did")
    location: str = Field(description="where the failure lies: the kernel path that ran it (cpu, rowwise, grouped or "
                                      "mma; '-' when the config never ran), or combine: the split-KV combine every "
                                      "path shares, where the partials were right and the combined output was not, "
                                      "or the fault's detail names the combine kernel")


class ExplanationPublic(BaseModel):
    conditions: list[str] = Field(description="the predicates over config fields and split arithmetic, all of which "
                                              "hold for the cluster (at most two)")
    text: str = Field(description="the conditions joined by 'and'")
    summary: str = Field(description="the conditions and how often configs fail where they hold and elsewhere")
    members: int = Field(description="configs in the cluster")
    covered: int = Field(description="members for which the conditions hold")
    passing_covered: int = Field(description="passing configs for which the conditions hold")
    passing: int = Field(description="passing configs of the sweep")
    precision: float = Field(description="covered / (covered + passing_covered)")
    recall: float = Field(description="covered / members")
    f1: float = Field(description="the harmonic mean of precision and recall: the explanation's score")
    rate_inside: float = Field(description="share of the configs failing among those the conditions hold for")
    rate_outside: float = Field(description="the same share among the other configs")


class ClassificationPublic(BaseModel):
    kind: Literal["deterministic", "data_dependent", "flaky", "nondeterministic", "passes"] = Field(
        description="deterministic: fails every time, whatever the data; data_dependent: the same inputs always fail, "
                    "other data passes; flaky: the same inputs give different results (a config that failed in the sweep or the "
                    "shrink and passes every repeat included); nondeterministic: passes but its "
                    "output bits differ between identical runs; passes: passes every time, no earlier failure known")
    repeats: int = Field(description="runs of the minimal config with its own inputs")
    same_input_failing: int = Field(description="of the repeats, runs that failed with the signature "
                                    "of the member the shrink started from")
    distinct_outputs: int = Field(description="distinct output digests among the repeats")
    seeds: list[int] = Field(description="other data seeds the minimal config ran with")
    seeds_failing: list[int] = Field(description="the seeds among them that failed with that signature")
    runs: int = Field(description="real runs the classification spent")


class ClusterBisection(BaseModel):
    id: int = Field(description="the bisection's id: GET /bisect/{id}")
    status: Literal["queued", "running", "done", "error"] = Field(description="queued, running, done (first_bad_commit "
                                                                              "set when it found one) or error")


class ClusterPublic(BaseModel):
    size: int = Field(description="failing configs in the cluster")
    signature: SignaturePublic = Field(description="outcome, gate and location the cluster is named by")
    signatures: dict[str, int] = Field(description="every signature among its members (outcome/gate/location) and how many "
                                                   "members have it: one bug can show several symptoms")
    explanation: ExplanationPublic = Field(description="what the cluster's configs have in common that passing ones lack")
    example_config: dict[str, Any] = Field(description="the member cheapest to run, where shrinking started")
    minimal_config: dict[str, Any] | None = Field(description="the smallest config found that fails the same way; null "
                                                              "when the cluster was not shrunk (beyond the triage's bounds)")
    reproducer: str | None = Field(description="a command line that runs the smallest config as the sweep did")
    reproducer_signature: SignaturePublic | None = Field(
        default=None, description="outcome, gate and location the reproducer gave when the triage ran it after making "
                                  "it (the cluster's signature when it reproduces the bug); null when not run")
    classification: ClassificationPublic | None = Field(description="whether the failure repeats; null when not classified")
    first_bad_commit: str | None = Field(description="the first commit of the kernel repository where it fails (a "
                                                     "CI push's bisection of it); null until bisected")
    bisection: ClusterBisection | None = Field(default=None, description="the CI push's bisection of this bug "
                                                                          "(GET /bisect/{id}); null when none was started")
    runs: int | None = Field(description="real runs shrinking and classifying it spent")
    config_hashes: list[str] = Field(description="content hashes of its member configs (GET /sweeps/{id}/results)")


class ClustersPublic(BaseModel):
    status: TriageStatus = Field(description="pending: the sweep or its triage is not finished; running: a worker "
                                             "triages it; done: clusters holds every bug; failed: triage could not run "
                                             "(error says why; the sweep's results stand); none: no triage was asked "
                                             "(a sweep that failed or was cancelled, or run with --no-triage)")
    error: str | None = Field(description="why the triage failed; null otherwise")
    clusters: list[ClusterPublic] = Field(description="the sweep's failures grouped by bug, largest first; empty "
                                                      "until the triage is done")
