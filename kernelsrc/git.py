"""Read kernels/src at a commit of the kernel repository (ATTNSWEEP_KERNEL_REPO), or its
attnsweep.toml and whole tree (kernelsrc/build.py builds it).

A local path (a working tree or a bare repository) is read in place. A URL is mirrored into a
bare repository under ATTNSWEEP_KERNEL_REPO_CACHE: the commit is fetched by its id (GitHub and
most servers serve any reachable commit, pull-request heads included), else every branch and
pull-request ref is fetched and the commit looked up again. Only git plumbing reads the tree,
so nothing is checked out and no hook of the repository runs.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
from pathlib import Path

from filelock import FileLock

from kernels.source import ENTRY_FILE, KernelSource
from kernelsrc.manifest import FILE_NAME as MANIFEST, MAX_BYTES as MAX_MANIFEST_BYTES, Manifest, parse_manifest

KERNEL_DIR = "kernels/src"
MAX_BUNDLE_BYTES = 8 << 20  # kernels/src is tens of kB; anything near this is not a kernel source
MAX_TREE_BYTES = 256 << 20  # a whole tree exported to be built (attnsweep.toml)
COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


class KernelRepoError(RuntimeError):
    """kernels/src could not be read. `missing`: the repository answered and the commit (or its
    kernels/src) is not there; otherwise the repository could not be reached or read."""

    def __init__(self, message: str, missing: bool = False):
        self.missing = missing
        super().__init__(message)


def _git(args: list[str], cwd: Path | None = None, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    # No prompt for credentials: a webhook must fail, not hang, on a private URL without them.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=timeout_s, env=env)
    except FileNotFoundError:
        raise KernelRepoError("git is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise KernelRepoError(f"git {args[0]} took longer than {timeout_s:g} s") from None


def _has_commit(git_dir: Path, commit: str) -> bool:
    return _git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=git_dir).returncode == 0


def _mirror(url: str, cache_dir: Path, commit: str) -> Path:
    git_dir = cache_dir / (hashlib.sha256(url.encode()).hexdigest()[:20] + ".git")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(git_dir) + ".lock", timeout=600):
        if not (git_dir / "HEAD").exists():
            done = _git(["init", "--quiet", "--bare", str(git_dir)])
            if done.returncode:
                raise KernelRepoError(f"cannot create a mirror in {git_dir}: {done.stderr.decode(errors='replace').strip()}")
        if _has_commit(git_dir, commit):
            return git_dir
        by_id = _git(["fetch", "--quiet", "--no-tags", "--depth=1", "--", url, commit], cwd=git_dir)
        if by_id.returncode == 0 and _has_commit(git_dir, commit):
            return git_dir
        refs = _git(["fetch", "--quiet", "--no-tags", "--", url, "+refs/heads/*:refs/mirror/heads/*",
                     "+refs/pull/*:refs/mirror/pull/*"], cwd=git_dir, timeout_s=600)
        if refs.returncode:
            raise KernelRepoError(f"fetching {url} failed: {refs.stderr.decode(errors='replace').strip()}")
    return git_dir


def _repository(repo: str, cache_dir: Path, commit: str) -> Path:
    if not repo:
        raise KernelRepoError("ATTNSWEEP_KERNEL_REPO is not set: there is no kernel repository to read commits from")
    path = Path(repo).expanduser()
    if "://" not in repo and not re.match(r"^[\w.-]+@[\w.-]+:", repo):
        if not path.is_dir():
            raise KernelRepoError(f"{repo!r} is neither a URL nor an existing folder on this host")
        return path
    return _mirror(repo, cache_dir, commit)


def _at_commit(repo: str, commit: str, cache_dir: Path) -> Path:
    """The git folder holding `commit` of `repo` (fetched when a mirror lacks it)."""
    if not COMMIT_RE.match(commit):
        raise KernelRepoError(f"{commit!r} is not a full commit id (40 or 64 lower-case hex digits)", missing=True)
    git_dir = _repository(repo, cache_dir, commit)
    if not _has_commit(git_dir, commit):
        raise KernelRepoError(f"commit {commit} is not in the kernel repository {repo}", missing=True)
    return git_dir


def read_manifest(repo: str, commit: str, cache_dir: Path) -> Manifest | None:
    """attnsweep.toml at the root of `commit`, parsed; None when the commit has none (the
    project's own layout, kernels/src). Raises KernelRepoError, ManifestError."""
    git_dir = _at_commit(repo, commit, cache_dir)
    listing = _git(["ls-tree", "-l", "-z", commit, "--", MANIFEST], cwd=git_dir)
    if listing.returncode:
        raise KernelRepoError(f"listing {MANIFEST} at {commit} failed: {listing.stderr.decode(errors='replace').strip()}")
    entry = listing.stdout.split(b"\0")[0]
    if not entry:
        return None
    mode, kind, blob, size = entry.split(b"\t", 1)[0].decode().split()
    if kind != "blob" or mode not in ("100644", "100755"):
        raise KernelRepoError(f"{MANIFEST} at {commit} is not a regular file", missing=True)
    if int(size) > MAX_MANIFEST_BYTES:
        raise KernelRepoError(f"{MANIFEST} at {commit} is larger than {MAX_MANIFEST_BYTES} bytes", missing=True)
    content = _git(["cat-file", "blob", blob], cwd=git_dir)
    if content.returncode:
        raise KernelRepoError(f"reading {MANIFEST} at {commit} failed")
    return parse_manifest(content.stdout)


def export_tree(repo: str, commit: str, cache_dir: Path, dest: Path, max_bytes: int = MAX_TREE_BYTES) -> None:
    """The whole tree of `commit` written into `dest` (an empty folder), as `git archive` gives
    it: no .git, no submodule, no hook run; links that leave the tree are refused."""
    git_dir = _at_commit(repo, commit, cache_dir)
    listing = _git(["ls-tree", "-r", "-l", "-z", "--full-tree", commit], cwd=git_dir)
    if listing.returncode:
        raise KernelRepoError(f"listing {commit} failed: {listing.stderr.decode(errors='replace').strip()}")
    total = sum(int(fields[3]) for fields in (e.split(b"\t", 1)[0].split() for e in listing.stdout.split(b"\0") if e)
                if fields[3] != b"-")
    if total > max_bytes:
        raise KernelRepoError(f"the tree at {commit} holds {total} bytes, more than the {max_bytes} a build may take",
                              missing=True)
    archive = dest.parent / (dest.name + ".tar")
    try:
        with open(archive, "wb") as out:
            try:
                done = subprocess.run(["git", "archive", "--format=tar", commit], cwd=git_dir, stdout=out,
                                      stderr=subprocess.PIPE, timeout=600, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
            except subprocess.TimeoutExpired:
                raise KernelRepoError(f"git archive of {commit} took longer than 600 s") from None
        if done.returncode:
            raise KernelRepoError(f"git archive of {commit} failed: {done.stderr.decode(errors='replace').strip()}")
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(dest, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise KernelRepoError(f"the tree at {commit} cannot be written out: {exc}", missing=True) from None
    finally:
        archive.unlink(missing_ok=True)


def read_kernels(repo: str, commit: str, cache_dir: Path) -> KernelSource:
    """kernels/src at `commit` (a full 40- or 64-digit commit id) of `repo` as a KernelSource."""
    git_dir = _at_commit(repo, commit, cache_dir)
    listing = _git(["ls-tree", "-r", "-z", "--full-tree", commit, "--", KERNEL_DIR], cwd=git_dir)
    if listing.returncode:
        raise KernelRepoError(f"listing {KERNEL_DIR} at {commit} failed: {listing.stderr.decode(errors='replace').strip()}")
    files: dict[str, str] = {}
    total = 0
    for entry in filter(None, listing.stdout.split(b"\0")):
        meta, path = entry.split(b"\t", 1)
        mode, kind, blob = meta.decode().split()
        if kind != "blob" or mode not in ("100644", "100755"):
            continue  # symlinks and submodules are not source a compiler is handed
        name = path.decode()[len(KERNEL_DIR) + 1:]
        content = _git(["cat-file", "blob", blob], cwd=git_dir)
        if content.returncode:
            raise KernelRepoError(f"reading {path.decode()} at {commit} failed")
        total += len(content.stdout)
        if total > MAX_BUNDLE_BYTES:
            raise KernelRepoError(f"{KERNEL_DIR} at {commit} is larger than {MAX_BUNDLE_BYTES} bytes", missing=True)
        try:
            files[name] = content.stdout.decode("utf-8")
        except UnicodeDecodeError:
            raise KernelRepoError(f"{path.decode()} at {commit} is not UTF-8 text", missing=True) from None
    if ENTRY_FILE not in files:
        raise KernelRepoError(f"commit {commit} has no {KERNEL_DIR}/{ENTRY_FILE}", missing=True)
    return KernelSource.from_files(files)


def commit_subject(repo: str, commit: str, cache_dir: Path) -> str:
    """The first line of a commit's message ("" when git cannot say)."""
    done = _git(["log", "-1", "--format=%s", commit, "--"], cwd=_repository(repo, cache_dir, commit))
    return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else ""


def first_parent_commits(repo: str, good: str, bad: str, cache_dir: Path) -> list[str]:
    """Full ids of `bad`'s first-parent history from `good` to `bad`, both included, oldest first
    (what a bisection walks). A local repository resolves any name git does (a short id, a
    branch); a URL's mirror is fetched with its whole history and needs full ids. Raises
    KernelRepoError (missing) when `good` is not on that line."""
    git_dir = _repository(repo, cache_dir, bad)
    if (git_dir / "shallow").exists():  # a mirror fetched one commit deep: bisection needs the history
        done = _git(["fetch", "--quiet", "--no-tags", "--unshallow", "--", repo,
                     "+refs/heads/*:refs/mirror/heads/*"], cwd=git_dir, timeout_s=600)
        if done.returncode:
            raise KernelRepoError(f"fetching the history of {repo} failed: {done.stderr.decode(errors='replace').strip()}")
    ids = []
    for name in (good, bad):
        done = _git(["rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], cwd=git_dir)
        if done.returncode:
            raise KernelRepoError(f"{name!r} is not a commit of the kernel repository {repo}", missing=True)
        ids.append(done.stdout.decode().strip())
    listing = _git(["rev-list", "--first-parent", "--reverse", f"{ids[0]}..{ids[1]}"], cwd=git_dir)
    if listing.returncode:
        raise KernelRepoError(f"listing {good}..{bad} failed: {listing.stderr.decode(errors='replace').strip()}")
    line = listing.stdout.decode().split()
    parent = _git(["rev-parse", f"{line[0]}^"], cwd=git_dir).stdout.decode().strip() if line else ""
    if not line or parent != ids[0]:
        raise KernelRepoError(f"{good} is not an ancestor of {bad} on its first-parent line", missing=True)
    return [ids[0], *line]
