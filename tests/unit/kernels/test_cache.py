"""The compile cache: hits, misses, keys, atomic writes, failures, and many processes at once.

The compiler is a fake that counts its calls: the cache, not the compiler, is under test.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from kernels.backends.base import CompileError
from settings import get_settings
from kernels.cache import Compiled, KernelCache, cache_key, default_cache_dir

FIELDS = {"variant": "attn_f16_qk64_v64_n32_m1_t128", "source_hash": "abc", "options": ["-arch=sm_90"],
          "arch": "sm_90", "compiler": "nvrtc 13.0"}


def fake_compiled(tag: str = "x") -> Compiled:
    return Compiled(binary=b"\x7fELF" + tag.encode() * 100, lowered_names={"attn<1>": "_Z4attnILi1EEvv"}, log="ok")


class Counter:
    def __init__(self, tag="x", delay=0.0):
        self.calls = 0
        self.tag = tag
        self.delay = delay

    def __call__(self) -> Compiled:
        self.calls += 1
        time.sleep(self.delay)
        return fake_compiled(self.tag)


def test_miss_then_hit(tmp_path):
    cache = KernelCache(tmp_path, enabled=True)
    fn = Counter()
    first = cache.load_or_compile(FIELDS["variant"], FIELDS, fn)
    second = cache.load_or_compile(FIELDS["variant"], FIELDS, fn)
    assert fn.calls == 1
    assert (first.hit, second.hit) == (False, True)
    assert second.compiled == first.compiled == fake_compiled()
    assert second.compile_s == 0.0 and first.compile_s >= 0.0
    assert first.path.name.startswith(FIELDS["variant"] + "-") and first.path.suffix == ".bin"
    # a fresh cache object (another worker) hits the same file
    assert KernelCache(tmp_path, enabled=True).load_or_compile(FIELDS["variant"], FIELDS, fn).hit
    assert fn.calls == 1


@pytest.mark.parametrize("field,value", [("source_hash", "abd"), ("options", ["-arch=sm_90", "-DX=1"]),
                                         ("arch", "sm_80"), ("compiler", "nvrtc 13.1")])
def test_every_key_field_separates_entries(tmp_path, field, value):
    cache = KernelCache(tmp_path, enabled=True)
    fn = Counter()
    cache.load_or_compile(FIELDS["variant"], FIELDS, fn)
    other = dict(FIELDS, **{field: value})
    assert cache_key(other) != cache_key(FIELDS)
    assert not cache.load_or_compile(FIELDS["variant"], other, fn).hit
    assert fn.calls == 2
    assert len(list(tmp_path.glob("*.bin"))) == 2


def test_disabled_cache_compiles_every_time_and_writes_nothing(tmp_path):
    cache = KernelCache(tmp_path, enabled=False)
    fn = Counter()
    for _ in range(3):
        assert not cache.load_or_compile("v", FIELDS, fn).hit
    assert fn.calls == 3
    assert not any(tmp_path.iterdir())


def test_environment_settings(tmp_path, monkeypatch):
    """The directory and the switch are the kernel_cache settings, read when a cache is made."""
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(tmp_path / "kc"))
    monkeypatch.delenv("ATTNSWEEP_KERNEL_CACHE_DISABLE", raising=False)
    get_settings.cache_clear()
    assert default_cache_dir() == tmp_path / "kc" == get_settings().kernel_cache
    cache = KernelCache()
    assert cache.directory == tmp_path / "kc" and cache.enabled
    cache.load_or_compile("v", FIELDS, Counter())
    assert list((tmp_path / "kc").glob("v-*.bin"))
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE_DISABLE", "1")
    get_settings.cache_clear()
    assert not KernelCache().enabled
    monkeypatch.delenv("ATTNSWEEP_KERNEL_CACHE")
    get_settings.cache_clear()
    assert default_cache_dir() == Path.home() / ".cache" / "attnsweep" / "kernels"


def test_corrupt_or_foreign_file_is_a_miss_and_is_rewritten(tmp_path):
    cache = KernelCache(tmp_path, enabled=True)
    path = cache.path_for("v", FIELDS)
    fn = Counter()
    cache.load_or_compile("v", FIELDS, fn)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])             # truncated
    assert not cache.load_or_compile("v", FIELDS, fn).hit
    assert path.read_bytes() == blob
    path.write_bytes(b"garbage")
    assert not cache.load_or_compile("v", FIELDS, fn).hit
    assert fn.calls == 3
    assert cache.load_or_compile("v", FIELDS, fn).hit


def test_compile_error_is_not_cached_and_releases_the_lock(tmp_path):
    cache = KernelCache(tmp_path, enabled=True, lock_timeout_s=2)

    def broken():
        raise CompileError("nvrtc failed", log="attention.hip(12): error: expected a ';'")

    with pytest.raises(CompileError) as e:
        cache.load_or_compile("v", FIELDS, broken)
    assert "expected a ';'" in e.value.log
    assert not list(tmp_path.glob("*.bin"))
    fn = Counter()
    assert not cache.load_or_compile("v", FIELDS, fn).hit and fn.calls == 1


def test_compile_timeout_raises_compile_error(tmp_path):
    cache = KernelCache(tmp_path, enabled=True, compile_timeout_s=0.2)
    with pytest.raises(CompileError) as e:
        cache.load_or_compile("v", FIELDS, Counter(delay=2.0))
    assert e.value.timed_out and "timed out" in str(e.value)
    assert not list(tmp_path.glob("*.bin"))


def test_write_is_atomic(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path, enabled=True)
    seen = []
    real_replace = os.replace

    def spy_replace(src, dst):
        # at the moment of the rename the destination does not exist yet and the temp file is complete
        seen.append((Path(src).parent == Path(dst).parent, Path(dst).exists(), Path(src).stat().st_size))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy_replace)
    res = cache.load_or_compile("v", FIELDS, Counter())
    assert seen == [(True, False, res.path.stat().st_size)]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def _worker(directory: str, counter_file: str, barrier, queue) -> None:
    def compile_once() -> Compiled:
        with open(counter_file, "a") as f:   # O_APPEND: one line per real compile
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return fake_compiled("concurrent")

    barrier.wait()
    res = KernelCache(directory, enabled=True).load_or_compile(FIELDS["variant"], FIELDS, compile_once)
    queue.put((res.hit, res.compiled.binary, res.compiled.lowered_names))


def test_concurrent_processes_compile_a_variant_once(tmp_path):
    ctx = mp.get_context("fork")
    n = 6
    barrier = ctx.Barrier(n)
    queue = ctx.Queue()
    counter = tmp_path / "compiles.txt"
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "kc"), str(counter), barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(counter.read_text().splitlines()) == 1          # compiled exactly once
    assert sorted(hit for hit, _, _ in results) == [False] + [True] * (n - 1)
    assert {b for _, b, _ in results} == {fake_compiled("concurrent").binary}
    assert not [p for p in (tmp_path / "kc").iterdir() if p.suffix == ".tmp"]
