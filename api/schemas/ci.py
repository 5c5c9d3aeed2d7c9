"""CI bodies: the webhook's reply, a commit's state and verdict, the commit list."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from attnconfig.config import INT8_MAX
from pydantic import BaseModel, ConfigDict, Field

from api.schemas.common import Metric

SweepState = Literal["queued", "running", "done", "cancelled", "failed"]
Verdict = Literal["pending", "pass", "fail", "error"]
SHA_PATTERN = r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$"


class CiWebhookReply(BaseModel):
    """202 `started`: a sweep of the commit is queued. 200 `replayed`: this delivery id started
    a sweep before, nothing new was started. 200 `ignored`: the event starts no sweep."""

    status: Literal["started", "replayed", "ignored"]
    reason: str | None = Field(default=None, description="why an event was ignored")
    event: str | None = None
    sweep_id: int | None = None
    commit_sha: str | None = None
    ref: str | None = None
    source_hash: str | None = Field(default=None, description="the stored bundle of kernels/src at the commit")
    configs_total: int | None = None
    tasks: int | None = Field(default=None, description="tasks published (0 on a replay)")
    queue: str | None = None
    status_url: str | None = None
    junit_url: str | None = None


class CiFailure(BaseModel):
    config_hash: str
    outcome: str
    failed_gate: str | None
    detail: str | None = Field(description="first line of the detail")
    config: dict[str, Any]
    metrics: dict[str, Metric]
    reproducer: str | None


class CiBisection(BaseModel):
    """The bisection of one bug of a push whose sweep has new failures (GET /bisect/{id} has all of it)."""

    id: int = Field(description="the bisection's id")
    cluster: int | None = Field(description="the bug it bisects: its index in GET /sweeps/{id}/clusters (0: the "
                                            "largest); null when the failures have no clusters (the triage failed)")
    status: Literal["queued", "running", "done", "error"] = Field(description="queued, running, done or error")
    good: str = Field(description="the push's `before` commit, where it starts")
    bad: str = Field(description="the pushed commit")
    first_bad: str | None = Field(description="the first commit at which the bug's config fails; null until done")
    candidates: list[str] = Field(description="when untestable commits leave it ambiguous: the commits it may be")
    configs: int = Field(description="configs it runs at each commit (one: the bug's representative failure)")
    error: str | None = Field(description="why it has no result (the repository cannot be read from the worker, ...)")
    url: str = Field(description="GET /bisect/{id}")


class CiStatus(BaseModel):
    """A commit's CI sweep: its state and verdict (pending, pass, fail, error) and its failures.
    For a pull request, `new_failures` fail the check and `known_failures` (also failing on the
    latest finished sweep of the base branch) do not; for a push every failure is new."""

    commit_sha: str
    repository: str | None
    ref: str | None
    event: Literal["push", "pull_request"]
    base_ref: str | None
    pr_number: int | None
    sweep_id: int
    state: SweepState
    verdict: Verdict
    source_hash: str | None
    configs: int
    configs_done: int
    failures: int
    failure_rate: Metric = Field(description="failures / (configs run - not_applicable); null before any ran")
    new_failure_count: int
    known_failure_count: int
    base_sweep_id: int | None
    base_commit_sha: str | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    new_failures: list[CiFailure]
    known_failures: list[CiFailure]
    junit_url: str
    triage: Literal["none", "pending", "running", "done", "failed"] = Field(
        description="the state of the sweep's triage (GET /sweeps/{id}/clusters)")
    bugs: int | None = Field(description="clusters of failures (one per bug) once triaged; null before")
    new_bugs: int | None = Field(description="bugs with at least one new failure (every bug of a push); null before "
                                             "the triage")
    summary: str | None = Field(description="the failures in words: '2 new bugs in 119 failing configs' once triaged, "
                                            "'119 failing' before, then '; bisecting' or '; first bad commit "
                                            "abc123456789' ('; first bad commits abc123456789, def123456789' when "
                                            "bugs came in with different commits) for a push whose new failures are "
                                            "bisected; null until the sweep ends")
    bisections: list[CiBisection] = Field(
        default_factory=list, description="a push with new failures that brought several commits: the search for the "
                                          "first bad commit of each bug with new failures (started after the triage), "
                                          "largest bug first; empty otherwise")
    first_bad_commits: list[str] = Field(default_factory=list, description="the distinct first bad commits the "
                                                                           "bisections found so far, largest bug first")


class CiCommit(BaseModel):
    """One CI sweep in GET /ci/commits (newest first)."""

    commit_sha: str
    ref: str | None
    event: Literal["push", "pull_request"]
    sweep_id: int
    state: SweepState
    verdict: Verdict
    configs: int
    failures: int
    failure_rate: Metric
    finished_at: datetime | None


class CiRepository(BaseModel):
    """A repository that sent CI events, with its newest CI sweep."""

    repository: str = Field(description="owner/name")
    sweeps: int = Field(description="CI sweeps of the repository")
    last_sweep_id: int = Field(description="its newest CI sweep")
    last_commit_sha: str | None = Field(description="the commit that sweep ran")
    last_ref: str | None = Field(description="that commit's branch")
    last_verdict: Verdict = Field(description="that sweep's verdict: pending, pass, fail or error")
    last_created_at: datetime | None = Field(description="when that sweep was accepted (UTC)")


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt parameter is a 422, not ignored


class CiStatusQuery(_Query):
    repository: str | None = Field(default=None, description="owner/name, when several repositories send events")
    event: Literal["push", "pull_request"] | None = Field(
        default=None, description="the push or the pull-request sweep of the commit (default: the newest)")


class CiCommitsQuery(_Query):
    repository: str | None = Field(default=None, description="owner/name (default: every repository)")
    limit: int = Field(default=50, ge=1, le=500)
    offset: int = Field(default=0, ge=0, le=INT8_MAX)
