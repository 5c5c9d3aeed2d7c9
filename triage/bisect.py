"""The first commit of a kernel repository at which given configs fail: a bisection of its
first-parent history, as `git bisect --first-parent` walks it.

Each commit tested is read as a source bundle (kernelsrc.git.read_kernels: kernels/src at that
commit) and its configs run on a backend built from it: a device backend or `hostemu` compiles
it, the `cpu` emulation takes its `#define ATTN_DEFECT_*` switches
(kernels.source.KernelSource.defect_switches). A commit is `bad` when any config fails, `good`
when all pass, and `skip` when the source does not compile for one of them (a CompileError;
only compiling backends can tell, the `cpu` emulation compiles nothing). A skipped commit is
stepped around as `git bisect skip` does: the untested commit nearest the midpoint is tried
instead. Both ends are checked first: a `good` that fails or a `bad` that passes is an error.

A commit with attnsweep.toml at its root (docs/plugins.md, "CI for any kernel repository") is
built instead (kernelsrc.build.build_commit, confined) and its configs run on the plug-in the
file names; a commit whose file breaks a rule or whose build fails is `skip`, as `git bisect
skip` is for a commit that does not build. `defects` then do not apply (a plug-in has its own).

`steps` counts the commits tested between the ends (skipped ones included), the two end
checks not: ceil(log2(n)) for n commits without skips. `progress`, when given, is called with the
result so far after each commit tested (a worker stores it as its heartbeat); whatever it raises
stops the bisection.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from attnconfig import AttentionConfig, parse_config
from kernelsrc.build import BuildError, build_commit
from kernelsrc.git import first_parent_commits, read_kernels
from kernelsrc.manifest import ManifestError
from settings import Settings, get_settings
from triage.attempt import Runner


class BisectError(RuntimeError):
    """The ends do not bracket a change: `good` fails, `bad` passes, or one of them does not compile."""


@dataclass
class BisectResult:
    first_bad: str | None          # None when skipped commits leave it ambiguous (see candidates)
    steps: int
    skipped: list[str]
    tested: list[tuple[str, str]] = field(default_factory=list)   # (commit, good|bad|skip), in test order
    candidates: list[str] = field(default_factory=list)           # the commits the first bad one may be
    runs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"first_bad": self.first_bad, "steps": self.steps, "skipped": self.skipped,
                "tested": [list(t) for t in self.tested], "candidates": self.candidates, "runs": self.runs}


def _cache_dir() -> Path:
    return get_settings().kernel_repo_cache


def bisect(repo: str, good: str, bad: str, configs: Sequence[AttentionConfig | dict[str, Any]], backend: str = "cpu",
           *, defects: frozenset[str] | tuple[str, ...] = frozenset(), cache_dir: Path | None = None,
           time_limit_s: float | None = 60.0, err_ratio_gate: float | None = None,
           progress: Callable[[BisectResult], None] | None = None, settings: Settings | None = None) -> BisectResult:
    """Bisect `good`..`bad` of `repo` (a path or URL) for the first commit where `configs` fail.
    `settings` (default: the process's) bound and place the builds of commits with attnsweep.toml."""
    parsed = [parse_config(c) for c in configs]
    if not parsed:
        raise ValueError("bisect needs at least one config")
    cache = cache_dir or _cache_dir()
    commits = first_parent_commits(repo, good, bad, cache)
    result = BisectResult(None, 0, [])
    settings = settings or get_settings()
    unbuilt: dict[str, str] = {}

    def runner_at(sha: str) -> Runner | None:
        """The runner of `sha`'s kernel; None when it has attnsweep.toml and does not build (why: `unbuilt`)."""
        try:
            built = build_commit(repo, sha, settings, cache)
        except (BuildError, ManifestError) as exc:
            unbuilt[sha] = str(exc)
            return None
        if built is None:
            return Runner(backend, defects, read_kernels(repo, sha, cache), err_ratio_gate=err_ratio_gate,
                          time_limit_s=time_limit_s)
        return Runner(backend, err_ratio_gate=err_ratio_gate, time_limit_s=time_limit_s, kernel=built.spec)

    def verdict(sha: str) -> str:
        runner = runner_at(sha)
        if runner is None:
            result.tested.append((sha, "skip"))
            if progress is not None:
                progress(result)
            return "skip"
        try:
            outcome = "good"
            for c in parsed:
                if not runner.compiles(c)[0]:
                    outcome = "skip"
                    break
                if runner.run(c).signature.failing:
                    outcome = "bad"
                    break
        finally:
            result.runs += runner.runs
            runner.close()
        result.tested.append((sha, outcome))
        if progress is not None:
            progress(result)
        return outcome

    for sha, want in ((commits[0], "good"), (commits[-1], "bad")):
        got = verdict(sha)
        if got != want:
            what = "does not compile or build" if got == "skip" else ("fails" if got == "bad" else "passes")
            why = f" ({unbuilt[sha]})" if sha in unbuilt else ""
            raise BisectError(f"the {want} end {sha} {what}: it cannot bound the bisection{why}")
    lo, hi = 0, len(commits) - 1
    skipped: set[int] = set()
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in skipped]
        if not untested:
            break
        mid = (lo + hi) // 2
        i = min(untested, key=lambda j: (abs(j - mid), j))
        result.steps += 1
        got = verdict(commits[i])
        if got == "skip":
            skipped.add(i)
            result.skipped.append(commits[i])
        elif got == "good":
            lo = i
        else:
            hi = i
    if any(j in skipped for j in range(lo + 1, hi)):
        result.candidates = commits[lo + 1:hi + 1]
    else:
        result.first_bad = commits[hi]
    return result
