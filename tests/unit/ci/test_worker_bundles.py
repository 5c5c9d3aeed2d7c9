"""A worker keeps one backend per source bundle, closing the least recently used beyond its limit."""
from __future__ import annotations

from kernels.source import KernelSource
from kernels.source import local_source
from sweeps.result import at_commit
from isolation.backend_cache import BackendCache


def _bundle(i: int) -> KernelSource:
    return KernelSource.from_files({**local_source().files, "attention.hip": local_source().entry_text + f"\n// rev {i}\n"})


def test_backends_are_per_bundle_and_the_oldest_is_closed_past_the_limit(monkeypatch):
    closed = []
    cache = BackendCache(limit=2)
    a, b, c = _bundle(1), _bundle(2), _bundle(3)
    first = cache.get("cpu", frozenset(), a)
    monkeypatch.setattr(first, "close", lambda: closed.append("a"))
    assert cache.get("cpu", frozenset(), a) is first
    assert cache.get("cpu", frozenset(), b).kernel_source is b
    assert cache.get("cpu", frozenset(), None) is not first
    assert closed == ["a"]  # three sources, room for two: a was used least recently
    assert cache.get("cpu", frozenset(), c).kernel_source is c


def test_reproducers_of_a_revision_check_it_out_first():
    assert at_commit("attnsweep verify --backend cpu", "ab" * 20) == f"git checkout {'ab' * 20} && attnsweep verify --backend cpu"
    assert at_commit("", "ab" * 20) == ""
