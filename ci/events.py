"""The push and pull_request events a CI sweep starts from; every other event is ignored.

Only the fields a sweep needs are read (GitHub's payloads carry many more). Refs are stored in
full form, `refs/heads/<branch>`, for both events, so a pull request's base branch matches the
ref of the pushes to that branch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attnconfig.config import INT4_MAX, storable_str, validation_problems

SHA = r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$"
# owner/name as code hosts spell them; the status URL is built from it, so no other character.
FULL_NAME = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"
ZERO_SHA = "0" * 40
SWEPT_ACTIONS = ("opened", "synchronize", "reopened")
BRANCH_PREFIX = "refs/heads/"


class EventError(ValueError):
    """The payload of a push or pull_request lacks a field a sweep needs; `problems` are (field, rule)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {r}" for f, r in problems))


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Repository(_Model):
    full_name: str = Field(max_length=200, pattern=FULL_NAME)

    @field_validator("full_name")
    @classmethod
    def _no_dot_segment(cls, v: str) -> str:
        if any(part in (".", "..") for part in v.split("/")):
            raise ValueError("full_name must be owner/name, neither of them . or ..")
        return v


class _HeadRepository(_Repository):
    """A pull request's head repository: the fork it comes from, or the base repository itself.
    Where its code can be fetched from (clone_url and the rest) is what a trusted fork is named by."""

    clone_url: str | None = Field(default=None, max_length=1000)
    html_url: str | None = Field(default=None, max_length=1000)
    ssh_url: str | None = Field(default=None, max_length=1000)
    git_url: str | None = Field(default=None, max_length=1000)


class _Push(_Model):
    ref: storable_str(255, 1)  # type: ignore[valid-type]
    before: str | None = Field(default=None, pattern=SHA)
    after: str = Field(pattern=SHA)
    deleted: bool = False
    repository: _Repository


class _Side(_Model):
    ref: storable_str(200, 1)  # type: ignore[valid-type]
    sha: str = Field(pattern=SHA)
    # Absent for a fork that was deleted; GitHub sends it otherwise.
    repo: _HeadRepository | None = None


class _PullRequest(_Model):
    head: _Side
    base: _Side


class _PullRequestEvent(_Model):
    action: str
    number: int = Field(ge=1, le=INT4_MAX)  # sweeps.pr_number is int4
    pull_request: _PullRequest
    repository: _Repository


@dataclass(frozen=True)
class CiEvent:
    """What a sweep of a commit is labelled with."""

    event: Literal["push", "pull_request"]
    repository: str
    ref: str
    commit_sha: str
    base_ref: str | None = None
    pr_number: int | None = None
    # A push: the branch's commit before it (None for a new branch), where a bisection of the
    # commits it brought starts.
    before: str | None = None
    # A pull request from a fork: the head repository's owner/name and the URLs of its code
    # (None, (): the head is in the base repository).
    fork: str | None = None
    fork_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ignored:
    reason: str


def _branch(ref: str) -> str:
    return ref if ref.startswith("refs/") else BRANCH_PREFIX + ref


def _validate(model: type[_Model], payload: Any) -> Any:
    if not isinstance(payload, dict):
        raise EventError([("body", "the payload must be a JSON object")])
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise EventError(validation_problems(exc)) from None


def parse_event(name: str, payload: Any) -> CiEvent | Ignored:
    """The sweep an event asks for, or why it asks for none. Raises EventError on a bad payload."""
    if name == "push":
        if isinstance(payload, dict) and (payload.get("deleted") or payload.get("after") == ZERO_SHA):
            return Ignored("push deletes a branch: nothing to sweep")
        push = _validate(_Push, payload)
        if not push.ref.startswith(BRANCH_PREFIX):
            return Ignored(f"push to {push.ref}: only branch pushes are swept")
        before = push.before if push.before not in (None, ZERO_SHA) else None
        return CiEvent("push", push.repository.full_name, push.ref, push.after, before=before)
    if name == "pull_request":
        action = payload.get("action") if isinstance(payload, dict) else None
        if isinstance(action, str) and action not in SWEPT_ACTIONS:
            return Ignored(f"pull_request action {action!r}: only {', '.join(SWEPT_ACTIONS)} are swept")
        pr = _validate(_PullRequestEvent, payload)
        head = pr.pull_request.head
        fork, urls = None, ()
        if head.repo is None or head.repo.full_name.lower() != pr.repository.full_name.lower():
            fork = head.repo.full_name if head.repo is not None else "(deleted)"
            if head.repo is not None:
                urls = tuple(u for u in (head.repo.clone_url, head.repo.html_url, head.repo.ssh_url, head.repo.git_url) if u)
        return CiEvent("pull_request", pr.repository.full_name, _branch(head.ref), head.sha,
                       base_ref=_branch(pr.pull_request.base.ref), pr_number=pr.number, fork=fork, fork_urls=urls)
    return Ignored(f"event {name!r} is not swept (push and pull_request are)")
