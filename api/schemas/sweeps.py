"""Sweep bodies: the request (SweepCreate, docs/spec.md §8 names), the sweep, its results."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.schemas.common import Metric
from attnconfig import AttentionConfig
from sweeps.spec import Label, SweepSpec, SweepSpecError
from workers.enqueue import DEFECT_NAMES

Defect = Literal[DEFECT_NAMES]  # type: ignore[valid-type]
SweepStatus = Literal["queued", "running", "done", "cancelled", "failed"]


class SweepCreate(SweepSpec):
    """A sweep request: docs/spec.md §8's fields, sampled on submission; or an explicit list of configs
    (a regression set), which is run as given, without sampling or prefilters."""

    configs: list[AttentionConfig] | None = Field(
        default=None, min_length=1, description="explicit configs to run instead of sampling (a regression set)")
    defects: list[Defect] = Field(  # type: ignore[valid-type]
        default_factory=list, description="known kernel bugs to compile in, to prove the sweep catches them")
    sanitize: Literal["memcheck", "racecheck", "synccheck", "initcheck"] | None = Field(
        default=None, description="run configs under NVIDIA compute-sanitizer with this tool (cuda workers only); "
                                  "a finding stores the config as `unsafe`")
    sanitize_share: float = Field(
        default=1.0, gt=0.0, le=1.0, description="with sanitize: the share of configs sanitized, stratified by "
                                                 "kernel variant (every variant at least once)")

    @model_validator(mode="after")
    def _configs_or_samples(self) -> "SweepCreate":
        problems = kernel_problems(self.kernel, self.defects)
        if self.sanitize and self.backend in ("cpu", "hip", "hostemu"):
            from isolation.sanitize import check_request

            try:
                check_request(self.sanitize, self.backend)
            except ValueError as exc:
                problems.append(("sanitize", str(exc)))
        if self.configs is not None:
            if "samples" in self.model_fields_set:
                problems.append(("samples", "give samples or configs, not both"))
            seen: dict[str, int] = {}
            for i, c in enumerate(self.configs):
                j = seen.setdefault(c.content_hash(), i)
                if j != i:
                    problems.append((f"configs.{i}", f"configs.{i} repeats configs.{j}"))
        if len(set(self.defects)) != len(self.defects):
            problems.append(("defects", "defects must not repeat a defect"))
        if problems:
            raise ValueError(SweepSpecError(problems))
        return self

    def spec(self) -> SweepSpec:
        return SweepSpec.model_validate(self.model_dump(exclude={"configs", "defects", "sanitize", "sanitize_share"}))


def kernel_problems(kernel: str, defects: list[str]) -> list[tuple[str, str]]:
    """Why the service will not sweep `kernel`: it sweeps what was installed with it (the project's
    own kernels, the shipped plug-ins, the entry points of installed packages), never a path or a
    module a request names (docs/security.md)."""
    from kernels.plugins.load import KernelSpecError, parse_kernel

    try:
        spec = parse_kernel(kernel)
    except KernelSpecError as exc:
        return [("kernel", str(exc).removeprefix("kernel: "))]
    if spec.kind in ("file", "so", "module", "tree", "commit"):
        return [("kernel", f"{kernel!r}: the service sweeps the kernels installed with it (GET /kernels): attnsweep, "
                           "a shipped plug-in or an installed package's entry point; a path or module is for the "
                           "command line, a commit's attnsweep.toml for the CI webhook")]
    if defects and not spec.is_default:
        return [("defects", f"defect switches are compiled into attnsweep's own kernels; kernel {kernel} has none")]
    return []


class SweepAccepted(BaseModel):
    """202: the sweep and its configs are committed; they are on the queue (`published`), or the
    broker did not take them now and the reconciler publishes them once it can."""

    id: int
    status: SweepStatus
    queue: str
    configs_total: int
    tasks: int
    seed: int
    draws: int
    filtered: dict[str, int]
    splitkv_budget: int
    budget_source: Literal["request", "device", "fallback"]
    published: bool = Field(description="every config is on the broker's queue; false: the reconciler publishes them")
    replayed: bool = Field(default=False, description="an earlier request with this Idempotency-Key made this sweep")


class SweepCancel(BaseModel):
    """POST /sweeps/{id}/cancel's body: nothing to say, but a write is JSON (`{}`)."""

    model_config = ConfigDict(extra="forbid")


class SweepRerun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    failures_only: bool = Field(default=False, description="re-run only the configs that failed (fail, nan, fault, unsafe, error, timeout, oom)")
    label: Label | None = Field(default=None, description="label of the new sweep (default: the original's)")


class SweepPublic(BaseModel):
    id: int
    label: str | None
    status: SweepStatus
    backend: str
    seed: int
    queue: str | None
    device: str | None
    configs_total: int
    configs_done: int
    outcomes: dict[str, int]
    not_applicable_reasons: dict[str, int]
    filtered: dict[str, int]
    draws: int
    splitkv_budget: int
    budget_source: str
    rerun_of: int | None
    kernel: str = Field(default="attnsweep", description="the kernel under test as asked for (attnsweep: the "
                                                         "project's own; a plug-in's name, docs/plugins.md)")
    kernel_name: str | None = Field(default=None, description="the name the kernel ran as (null until a result says)")
    kernel_version: str | None = Field(default=None, description="its version: a package version or a source digest")
    submitted_by: str | None = Field(default=None, description="the name of the API token that submitted it "
                                                               "(webhook: a CI delivery; cli: the command line); null "
                                                               "where authentication was off")
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    throughput: Metric = Field(description="configs finished per second since the first started (null before)")
    request: dict[str, Any]
    bugs: int | None = Field(default=None, description="bugs its triage found (GET /sweeps/{id}/clusters); null until "
                                                       "the triage is done")


class SweepsPublic(BaseModel):
    data: list[SweepPublic]
    count: int


class ConfigRunPublic(BaseModel):
    """One config of a sweep and, once run, its result (docs/spec.md §7)."""

    id: int
    sweep_id: int
    label: str | None
    seq: int
    config_hash: str
    config: dict[str, Any]
    data_regime: str = Field(description="the config's input regime (docs/spec.md §1)")
    state: Literal["queued", "done", "cancelled"]
    outcome: str | None
    failed_gate: str | None
    detail: str | None
    not_applicable_reason: str | None
    rms_threshold: Metric
    threshold_reason: str | None
    gates: dict[str, Any] | None
    backend: str | None
    device: str | None
    driver_version: str | None
    compiler_version: str | None
    variant: str | None
    block_n: int | None
    source_hash: str | None
    metrics: dict[str, Metric]
    timings: dict[str, Metric]
    facts: dict[str, Metric] | None = Field(
        default=None, description="numeric facts of the run's inputs and reference (fact_* keys, docs/spec.md §6 "
                                  "\"Coverage\"); null where the config did not run")
    reproducer: str | None
    kernel: str | None = Field(default=None, description="the kernel that ran it, name (null: stored before "
                                                         "plug-ins, the project's own)")
    kernel_version: str | None = None
    worker: str | None
    attempts: int
    finished_at: datetime | None


class ConfigRunsPublic(BaseModel):
    data: list[ConfigRunPublic]
    count: int | None = Field(description="rows matching (null unless asked for with with_count on /failures)")
    has_more: bool
