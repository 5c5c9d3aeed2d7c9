"""The verdict of a CI sweep, from its failures and (for a pull request) its base branch's.

- Not finished (queued, running): `pending`. Failed or cancelled: `error` (the sweep, not the
  kernels, went wrong; its `error` says why).
- A push: `fail` when any config failed (attnconfig.outcomes.FAILING_OUTCOMES: fail, nan, fault,
  unsafe, error, timeout, oom), else `pass`.
- A pull request: its failures are compared, config by config (the config's content hash), with
  those of the latest finished sweep of the base branch. A failure the base also had is *known*:
  listed, but it does not fail the check. Any other failure is *new* and fails it, including a
  failure of a config the base sweep did not run; with no finished base sweep every failure
  is new. CI sweeps share one seed (ATTNSWEEP_CI_SEED), so both sweeps run the same configs
  as long as the settings and the split-KV budget did not change between them.

Failures are reported by bug once the sweep's triage stored its clusters (store/clusters.py):
"2 bugs in 119 failing configs" for a push, "2 new bugs in 119 failing configs" for a pull
request, where a bug is new when any of its configs is a new failure. Until then (or without a
triage) the wording counts configs only.

A push whose failures are new at its `before` commit and that brought several commits is
bisected once per bug (workers/bisect.py); the text then ends "; bisecting" while one runs and
"; first bad commit abc123456789" once known, "; first bad commits abc123456789, def123456789"
when the bugs came in with different commits (`bisections_text`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Literal, Sequence

Verdict = Literal["pending", "pass", "fail", "error"]
FINISHED = "done"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    new: tuple[str, ...]     # config hashes of failures that fail the check
    known: tuple[str, ...]   # config hashes of failures the base branch already had


def judge(status: str, event: str | None, failing: Sequence[str], base_failing: Collection[str] | None) -> Judgement:
    """`failing`: config hashes of the sweep's failures; `base_failing`: the base sweep's (None: no base)."""
    if status in ("queued", "running"):
        return Judgement("pending", (), ())
    if status != FINISHED:
        return Judgement("error", (), ())
    if event == "pull_request" and base_failing is not None:
        base = set(base_failing)
        known = tuple(h for h in failing if h in base)
        new = tuple(h for h in failing if h not in base)
    else:
        new, known = tuple(failing), ()
    return Judgement("fail" if new else "pass", new, known)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def new_bugs(judgement: Judgement, clusters: Iterable[Collection[str]]) -> int:
    """Clusters (each the config hashes of one bug) holding at least one new failure."""
    new = set(judgement.new)
    return sum(1 for members in clusters if new.intersection(members))


def failures_text(judgement: Judgement, failing: int, clusters: Sequence[Collection[str]] | None,
                  compared: bool) -> str:
    """The failures of a finished sweep in words: by bug when `clusters` (config hashes per
    stored cluster) are given, else by config. `compared`: a pull request with a base sweep."""
    if clusters is None:
        text = f"{failing} failing"
        if compared:
            text += f" ({len(judgement.new)} new, {len(judgement.known)} known on the base branch)"
        return text
    if not compared:
        return f"{_plural(len(clusters), 'bug')} in {_plural(failing, 'failing config')}"
    fresh = new_bugs(judgement, clusters)
    text = f"{_plural(fresh, 'new bug')} in {_plural(failing, 'failing config')}"
    known = len(clusters) - fresh
    return text + (f" ({_plural(known, 'bug')} known on the base branch)" if known else "")


SHORT_SHA = 12


def bisection_text(status: str, first_bad: str | None, candidates: Sequence[str] = ()) -> str:
    """A CI bisection's state in words, for the end of the failures text and the commit status."""
    if status in ("queued", "running"):
        return "bisecting"
    if status == "done" and first_bad:
        return f"first bad commit {first_bad[:SHORT_SHA]}"
    if status == "done":
        return f"first bad commit one of {_plural(len(candidates), 'commit')} (untestable commits between)"
    return "bisection failed"


def bisections_text(bisections: Sequence[tuple[str, str | None, Sequence[str]]]) -> str:
    """A CI sweep's bisections (status, first bad commit, candidates; one per bug) in words: each
    distinct first bad commit found, then "bisecting" while any is queued or runs, then the
    ambiguous and failed ones counted. One bisection reads as bisection_text."""
    if len(bisections) == 1:
        return bisection_text(*bisections[0])
    found: list[str] = []
    for status, first_bad, _ in bisections:
        if status == "done" and first_bad and first_bad[:SHORT_SHA] not in found:
            found.append(first_bad[:SHORT_SHA])
    parts = [f"first bad commit{'s' if len(found) > 1 else ''} {', '.join(found)}"] if found else []
    if any(status in ("queued", "running") for status, _, _ in bisections):
        parts.append("bisecting")
    ambiguous = sum(1 for status, first_bad, _ in bisections if status == "done" and not first_bad)
    if ambiguous:
        parts.append(f"{ambiguous} ambiguous (untestable commits)")
    failed = sum(1 for status, _, _ in bisections if status == "error")
    if failed:
        parts.append(f"{failed} of {len(bisections)} bisections failed")
    return "; ".join(parts)
