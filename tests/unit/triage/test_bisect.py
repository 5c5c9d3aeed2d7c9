"""Bisection over a kernel repository built here (tests/kernel_repo.py, the `kernel_repo`
fixture): 25 commits of kernels/src, one of which turns the causal_off_by_one switch on and an
earlier one that does not compile."""
from __future__ import annotations

import math
import shutil

import pytest

from tests.kernel_repo import BROKEN, COMMITS, CONFIG, DEFECT
from triage.bisect import BisectError, bisect

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="hostemu compiles with the host's g++, absent here")


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


def test_progress_sees_every_commit_tested_and_can_stop_the_bisection(kernel_repo, tmp_path):
    repo, shas = kernel_repo
    seen: list[list[tuple[str, str]]] = []
    result = bisect(str(repo), shas[0], shas[-1], [CONFIG], "cpu", cache_dir=tmp_path,
                    progress=lambda partial: seen.append(list(partial.tested)))
    assert [len(s) for s in seen] == list(range(1, len(result.tested) + 1)) and seen[-1] == result.tested

    class Stop(Exception):
        pass

    def stop_after_the_ends(partial):  # noqa: ANN001, ANN202
        if len(partial.tested) == 2:
            raise Stop()

    with pytest.raises(Stop):
        bisect(str(repo), shas[0], shas[-1], [CONFIG], "cpu", cache_dir=tmp_path, progress=stop_after_the_ends)
