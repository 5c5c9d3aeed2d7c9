"""Bisection over a kernel repository built here: 25 commits of kernels/src, one of which turns
the causal_off_by_one switch on and an earlier one that does not compile."""
from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels.source import SRC_DIR
from triage.bisect import BisectError, bisect

COMMITS = 25
BROKEN = 12      # the first midpoint of 0..24: bisection meets it at once and must step around it
DEFECT = 17      # the first commit whose source defines ATTN_DEFECT_CAUSAL_OFF_BY_ONE
CONFIG = dict(dtype="f32", g=1, seq_len_q=4, seq_len_k=40, num_heads_q=1, num_heads_kv=1, head_dim_qk=8,
              head_dim_v=8, causal=True)
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="hostemu compiles with the host's g++, absent here")


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


def build_kernel_repo(repo: Path) -> list[str]:
    """COMMITS commits of kernels/src in `repo` (an empty folder); their ids, oldest first."""
    _git(repo, "init", "--quiet", "-b", "main")
    src = repo / "kernels" / "src"
    shutil.copytree(SRC_DIR, src)
    entry = src / "attention.hip"
    pristine = entry.read_text()
    shas = []
    for i in range(COMMITS):
        text = pristine
        if i >= DEFECT:
            text = "#define ATTN_DEFECT_CAUSAL_OFF_BY_ONE\n" + text
        if i == BROKEN:
            text += "\nthis line is not C++;\n"
        entry.write_text(text + "".join(f"// revision {j}\n" for j in range(i + 1)))
        _git(repo, "add", "-A")
        _git(repo, "commit", "--quiet", "-m", f"revision {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


@pytest.fixture(scope="module")
def kernel_repo(tmp_path_factory) -> tuple[Path, list[str]]:
    repo = tmp_path_factory.mktemp("kernel-repo")
    return repo, build_kernel_repo(repo)


def test_cpu_bisection_finds_the_commit_that_turns_the_defect_on(kernel_repo, tmp_path):
    repo, shas = kernel_repo
    result = bisect(str(repo), shas[0], shas[-1], [CONFIG], "cpu", cache_dir=tmp_path)
    assert result.first_bad == shas[DEFECT]
    assert result.steps <= math.log2(COMMITS) + 2
    assert result.skipped == []   # the cpu emulation compiles nothing: the broken commit is good there
    assert result.tested[:2] == [(shas[0], "good"), (shas[-1], "bad")]


def test_the_ends_must_bound_a_change(kernel_repo, tmp_path):
    repo, shas = kernel_repo
    with pytest.raises(BisectError, match="good end .* fails"):
        bisect(str(repo), shas[DEFECT], shas[-1], [CONFIG], "cpu", cache_dir=tmp_path)
    with pytest.raises(BisectError, match="bad end .* passes"):
        bisect(str(repo), shas[0], shas[DEFECT - 1], [CONFIG], "cpu", cache_dir=tmp_path)


@needs_cxx
def test_hostemu_bisection_skips_the_commit_that_does_not_compile(kernel_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(tmp_path / "kernels"))
    repo, shas = kernel_repo
    result = bisect(str(repo), shas[0][:10], "main", [CONFIG], "hostemu", cache_dir=tmp_path)
    print(f"\nhostemu bisect: steps={result.steps} skipped={result.skipped} tested={result.tested}")
    assert result.first_bad == shas[DEFECT]
    assert result.skipped == [shas[BROKEN]]
    assert result.steps <= math.log2(COMMITS) + 2
