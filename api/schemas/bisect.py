"""Bisection bodies: POST /bisect's request and answer, GET /bisect/{id}."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StringConstraints, model_validator

from api.schemas.sweeps import Defect
from attnconfig import AttentionConfig, ConfigError
from attnconfig.config import storable_str

MAX_CONFIGS = 20  # every commit tested runs each of them: a bisection stays a few hundred runs
BisectionStatus = Literal["queued", "running", "done", "error"]
FULL_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
# A commit id, a short id, a branch or tag, `main~3`: what `git rev-parse` reads, but never an
# option (a leading '-') and no spaces.
_REF = re.compile(r"^[0-9A-Za-z_][0-9A-Za-z_./@^~+-]*$")


def _revision(value: str) -> str:
    if not _REF.match(value):
        raise ValueError("must be a commit id or a name git resolves (letters, digits and _ . / @ ^ ~ + -, "
                         "not starting with '-' or '.')")
    return value


Revision = Annotated[str, StringConstraints(min_length=1, max_length=255), AfterValidator(_revision)]


def is_url(repo: str) -> bool:
    """kernelsrc.git's reading of a repository: a URL (scheme://, or user@host:path) is mirrored."""
    return "://" in repo or re.match(r"^[\w.-]+@[\w.-]+:", repo) is not None


class BisectCreate(BaseModel):
    """A bisection: the first commit of `repo`'s first-parent history from `good` to `bad` at which
    any of `configs` fails."""

    model_config = ConfigDict(extra="forbid")

    repo: storable_str(1000, 1) = Field(  # type: ignore[valid-type]
        description="the kernel repository as the workers reach it: a local path on the worker's host or a git URL")
    good: Revision = Field(description="a commit where every config passes (a URL repository: a full commit id)")
    bad: Revision = Field(description="a later commit on its first-parent line where a config fails (a URL "
                                      "repository: a full commit id)")
    configs: list[AttentionConfig] = Field(min_length=1, max_length=MAX_CONFIGS,
                                           description=f"the configs run at each commit tested, 1 to {MAX_CONFIGS}: "
                                                       "a commit is bad when any of them fails")
    backend: Literal["cpu", "hostemu", "cuda", "hip", "auto"] = Field(
        default="cpu", description="cpu (sees a commit's defect switches only) or hostemu on the cpu queue; cuda, hip "
                                   "or auto on the GPU queue. hostemu and the GPU backends compile each commit and "
                                   "skip those that do not compile")
    defects: list[Defect] = Field(  # type: ignore[valid-type]
        default_factory=list, description="defect switches compiled in at every commit, besides the commit's own")
    err_ratio_gate: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False,
                                               description="also fail configs whose out_err_ratio exceeds this")

    @model_validator(mode="after")
    def _rules(self) -> "BisectCreate":
        problems = []
        if self.good == self.bad:
            problems.append(("bad", "bad must name another commit than good"))
        if is_url(self.repo):
            for name in ("good", "bad"):
                if not FULL_SHA.match(getattr(self, name)):
                    problems.append((name, f"{name}: a URL repository is mirrored and needs a full commit id (40 or 64 "
                                           "lower-case hex digits); a local path takes any name git resolves"))
        if len(set(self.defects)) != len(self.defects):
            problems.append(("defects", "defects must not repeat a defect"))
        seen: dict[str, int] = {}
        for i, c in enumerate(self.configs):
            j = seen.setdefault(c.content_hash(), i)
            if j != i:
                problems.append((f"configs.{i}", f"configs.{i} repeats configs.{j}"))
        if problems:
            raise ValueError(ConfigError(problems))
        return self


class BisectionAccepted(BaseModel):
    """202: the bisection is stored and its task queued for a worker (`published`), or the broker did
    not take it now and the reconciler publishes it."""

    id: int = Field(description="the bisection's id")
    status: BisectionStatus = Field(description="queued")
    queue: str = Field(description="the broker queue its task goes to (its backend's)")
    published: bool = Field(description="the task is on the broker's queue; false: the reconciler publishes it")
    url: str = Field(description="GET it here: its status and, once done, the first bad commit")


class BisectStep(BaseModel):
    commit: str = Field(description="a full commit id")
    verdict: Literal["good", "bad", "skip"] = Field(
        description="good: every config passed; bad: one failed; skip: the source does not compile (compiling backends)")


class BisectionPublic(BaseModel):
    """A bisection: its request, its state and, once done, its result."""

    id: int = Field(description="the bisection's id")
    status: BisectionStatus = Field(description="queued, running (a worker holds it), done (first_bad, or "
                                                "candidates when untestable commits leave it ambiguous) or error")
    repo: str = Field(description="the kernel repository bisected (a path or a URL)")
    good: str = Field(description="the good end as asked")
    bad: str = Field(description="the bad end as asked")
    backend: str = Field(description="the backend each commit's configs ran on")
    configs: list[dict[str, Any]] = Field(description="the configs run at each commit")
    defects: list[str] = Field(description="defect switches compiled in at every commit")
    err_ratio_gate: float | None = Field(description="the err_ratio bound, when asked for")
    first_bad: str | None = Field(description="the first commit at which a config fails; null until done, or when "
                                              "skipped commits leave it ambiguous")
    steps: int | None = Field(description="commits tested between the two ends, skipped ones included; null until done")
    skipped: list[str] = Field(description="commits that did not compile, stepped around")
    tested: list[BisectStep] = Field(description="every commit tested, in order, the two ends first; grows while it runs")
    candidates: list[str] = Field(description="when ambiguous: the commits the first bad one may be, oldest first")
    runs: int | None = Field(description="config runs spent; null until done")
    error: str | None = Field(description="why there is no result: the ends do not bound a change, the repository or "
                                          "a commit cannot be read, the backend is not available here ...")
    attempts: int = Field(description="workers that took it (more than one: a worker died while running it)")
    submitted_by: str | None = Field(default=None, description="the name of the API token that asked for it (webhook: "
                                                               "a CI push's); null where authentication was off")
    repository: str | None = Field(description="a CI push's bisection: owner/name of the repository pushed to")
    commit_sha: str | None = Field(description="a CI push's bisection: the pushed commit")
    sweep_id: int | None = Field(description="a CI push's bisection: the sweep of the pushed commit")
    cluster: int | None = Field(default=None, description="a CI push's bisection of one bug: its index in GET "
                                                          "/sweeps/{sweep_id}/clusters (0: the largest); null otherwise")
    created_at: datetime = Field(description="when it was asked for (UTC)")
    started_at: datetime | None = Field(description="when a worker last took it (UTC)")
    finished_at: datetime | None = Field(description="when it ended (UTC)")
