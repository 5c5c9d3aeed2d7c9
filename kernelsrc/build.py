"""A commit whose root has attnsweep.toml (kernelsrc/manifest.py), built to be swept.

`build_commit` exports the commit's whole tree (git archive, at most git.MAX_TREE_BYTES) into
a folder of its own under ATTNSWEEP_KERNEL_CACHE/built/, runs the manifest's build command there
confined (isolation/build.py: no network, no secret, only that folder writable, the sandbox's
limits and ATTNSWEEP_BUILD_TIME_LIMIT_S), and answers the plug-in spec that loads the result
(`tree:COMMIT:ROOT|PLUGIN`, kernels/plugins/load.py): a plug-in that did not ship, so it runs
confined too, with the tree bound read-only. The plug-in is stored under its own name and the
commit as its version.

A commit is built once per host: its folder keeps the tree and a mark of the outcome, a failed
build included (BuildError again, with the same log), under a file lock, so the workers of a
host and a bisection share one build. A host that cannot confine (SandboxUnavailable) marks
nothing: another host may build it.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from isolation.build import log_tail, run_build
from isolation.sandbox import SandboxUnavailable
from kernels.plugins.load import tree_spec
from kernelsrc.git import KernelRepoError, export_tree, read_manifest
from kernelsrc.manifest import Manifest, ManifestError
from settings import Settings

OK_MARK, FAILED_MARK, LOG = "built", "failed", "build.log"


class BuildError(RuntimeError):
    """The commit's kernel could not be built or found after its build: str() says why and ends
    with the end of the build's log."""

    def __init__(self, reason: str, log: str = ""):
        self.reason, self.log = reason, log
        super().__init__(f"{reason}; the build's log ends: {log}" if log else reason)


@dataclass(frozen=True)
class BuiltKernel:
    commit: str
    root: Path
    manifest: Manifest

    @property
    def spec(self) -> str:
        return tree_spec(self.commit, str(self.root), self.manifest.plugin)


def work_dir(settings: Settings, commit: str) -> Path:
    return Path(settings.kernel_cache) / "built" / commit


def _plugin_problem(built: BuiltKernel) -> str | None:
    rel = built.manifest.plugin_path
    if rel is None:
        return None
    path = built.root / rel
    if path.is_symlink() or not path.is_file():
        return f"attnsweep.toml: kernel.plugin: {rel} is not a file of the tree after the build"
    if not path.resolve().is_relative_to(built.root.resolve()):
        return f"attnsweep.toml: kernel.plugin: {rel} leads outside the tree"
    return None


def build_commit(repo: str, commit: str, settings: Settings, cache_dir: Path | None = None) -> BuiltKernel | None:
    """The built kernel of `commit` of `repo`; None when the commit has no attnsweep.toml (the
    project's own layout, kernels/src). Raises kernelsrc.git.KernelRepoError (the commit cannot be
    read), kernelsrc.manifest.ManifestError (the file breaks a rule), BuildError (the build
    failed, or made no plug-in), isolation.sandbox.SandboxUnavailable (nothing confines here)."""
    cache = cache_dir or settings.kernel_repo_cache
    manifest = read_manifest(repo, commit, cache)
    if manifest is None:
        return None
    work = work_dir(settings, commit)
    work.parent.mkdir(parents=True, exist_ok=True)
    built = BuiltKernel(commit, work / "tree", manifest)
    with FileLock(str(work) + ".lock", timeout=settings.build_time_limit_s + 600):
        if (work / OK_MARK).is_file():
            return built
        if (work / FAILED_MARK).is_file():
            raise BuildError((work / FAILED_MARK).read_text(), log_tail(work / LOG))
        shutil.rmtree(work, ignore_errors=True)
        built.root.mkdir(parents=True)
        export_tree(repo, commit, cache, built.root)
        if manifest.build is not None:
            run = run_build(manifest.build, built.root, settings, work / LOG)
            if not run.ok:
                (work / FAILED_MARK).write_text(run.reason)
                raise BuildError(run.reason, run.log_tail)
        problem = _plugin_problem(built)
        if problem is not None:
            (work / FAILED_MARK).write_text(problem)
            raise BuildError(problem, log_tail(work / LOG))
        (work / OK_MARK).write_text(commit)
    return built


def resolve_kernel(kernel: str, settings: Settings) -> tuple[str, str | None]:
    """(the kernel to run, None), or (the kernel, why none of its configs can run, scrubbed): a
    `commit:SHA` kernel (a CI sweep's) is built here from ATTNSWEEP_KERNEL_REPO and run as its
    tree's plug-in; any other kernel is itself."""
    if not kernel.startswith("commit:"):
        return kernel, None
    commit = kernel.removeprefix("commit:")
    try:
        built = build_commit(settings.kernel_repo, commit, settings)
    except (BuildError, ManifestError) as exc:
        return kernel, settings.scrub(f"build of commit {commit[:12]} failed: {exc}")
    except (KernelRepoError, SandboxUnavailable) as exc:
        return kernel, settings.scrub(f"commit {commit[:12]} cannot be built on this worker: {exc}")
    if built is None:
        return kernel, f"commit {commit[:12]} has no attnsweep.toml: there is no plug-in to build"
    return built.spec, None
