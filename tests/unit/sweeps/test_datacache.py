"""sweeps.datacache: a hit gives the bytes the computation gives; a damaged entry is a miss; the
folder stays under its bound; concurrent writers of one key leave a whole entry."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pytest

from attnconfig import parse_config
from kernels.backends.cpu import CpuEmulationBackend
from reference import make_inputs
from sweeps.datacache import DataCache, compute_reference
from sweeps.plan import plan_sweep
from sweeps.runner import run_config
from sweeps.spec import SweepSpec

SMALL = {"g": [1, 2], "seq_len_q": [1, 8], "seq_len_k": [1, 300], "num_heads_q": [1, 8], "num_heads_kv": [1, 8],
         "head_dim_qk": [1, 64], "head_dim_v": [1, 64]}


def sampled(n: int, seed: int) -> list:
    """Configs of every dtype, regime, mask and split count the default draw makes, kept small."""
    spec = SweepSpec(samples=n, seed=seed, backend="cpu", ranges=SMALL,
                     data_regimes={"normal": 1, "sink": 1, "outliers": 1, "large_logits": 1, "uniform": 1,
                                   "cancellation": 1})
    return plan_sweep(spec, device_total_memory=None).configs


def same(a, b) -> bool:
    """Equal bits, dtype and shape (NaN payloads and signed zeros included)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_same_inputs(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, np.ndarray):
            assert same(got[name], value), name
            assert not got[name].flags.writeable, name
        else:
            assert got[name] == value and type(got[name]) is type(value), name


def assert_same_reference(got, want) -> None:
    (ref, low), (ref0, low0) = got, want
    assert same(low, low0)
    for name in ("out_f32", "lse_f32", "o_partials", "lse_partials", "valid_splits"):
        assert same(getattr(ref, name), getattr(ref0, name)), name
    assert same(ref.row_scales.out, ref0.row_scales.out) and same(ref.row_scales.partials, ref0.row_scales.partials)
    assert ref.block_n == ref0.block_n and ref.storage == ref0.storage
    assert same(ref.out, ref0.out) and same(ref.lse, ref0.lse)


def test_a_hit_returns_the_computed_bytes_for_every_kind_of_config(tmp_path):
    configs = sampled(40, seed=11)
    assert {c.dtype for c in configs} == {"f16", "bf16", "f32", "i8"}
    assert len({c.data_regime for c in configs}) == 6 and any(c.split_kv > 1 for c in configs)
    cache = DataCache(tmp_path, 1 << 30)
    for c in configs:
        block_n = 16 if c.data_seed % 2 else 32
        want_inputs = make_inputs(c)
        want_ref = compute_reference(c, want_inputs, block_n)
        first, hit = cache.inputs(c)
        assert not hit
        ref, low, hit = cache.reference(c, first, block_n)
        assert not hit
        again, hit = cache.inputs(c)
        assert hit
        assert_same_inputs(again, want_inputs)
        *got, hit = cache.reference(c, again, block_n)
        assert hit
        assert_same_reference(got, want_ref)
    # Another block_n is another reference, never the stored one.
    c = next(c for c in configs if c.split_kv > 1)
    cache.reference(c, make_inputs(c), 64)
    assert cache.stats.hits == 2 * len(configs)


def test_the_trailing_splits_no_key_reached_come_back_as_computed(tmp_path):
    c = parse_config(dict(dtype="f16", g=2, seq_len_q=3, seq_len_k=40, num_heads_q=4, num_heads_kv=2, head_dim_qk=16,
                          head_dim_v=16, split_kv=64, return_lse=True, data_seed=5))
    inputs = make_inputs(c)
    cache = DataCache(tmp_path, 1 << 30)
    want = compute_reference(c, inputs, 32)
    cache.reference(c, inputs, 32)
    entry = next(tmp_path.glob("*-reference.entry"))
    # 64 splits of 3 x 4 x 2 rows of 16 floats are 24 KiB: two splits hold every key
    assert entry.stat().st_size < 8 * 1024
    *got, hit = cache.reference(c, inputs, 32)
    assert hit
    assert_same_reference(got, want)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "other key"])
def test_a_damaged_entry_is_a_miss_and_the_computation_runs(tmp_path, damage):
    c = sampled(4, seed=3)[0]
    cache = DataCache(tmp_path, 1 << 30)
    cache.inputs(c)
    entry = next(tmp_path.glob("*-inputs.entry"))
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "empty":
        data = bytearray()
    else:   # a whole, valid entry of another config under this one's name
        other = sampled(4, seed=3)[1]
        cache.inputs(other)
        data = bytearray(cache.path(_inputs_key(other)).read_bytes())
    entry.write_bytes(bytes(data))
    got, hit = cache.inputs(c)
    assert not hit and cache.stats.corrupt == 1
    assert_same_inputs(got, make_inputs(c))
    # Rewritten by the miss: the next lookup hits.
    assert cache.inputs(c)[1]


def _inputs_key(c):
    from sweeps.datacache import _key

    return _key(c, "inputs")


def test_the_folder_keeps_its_bound_idle_entries_go_first_then_the_largest(tmp_path):
    configs = sampled(30, seed=5)
    sizes = {}
    probe = DataCache(tmp_path / "probe", 1 << 30)
    for c in configs:
        probe.inputs(c)
        sizes[c.content_hash()] = probe.path(_inputs_key(c)).stat().st_size
    size = lambda c: sizes[c.content_hash()]  # noqa: E731
    bound = sum(sizes.values()) // 3
    folder = tmp_path / "bounded"
    cache = DataCache(folder, bound, max_entry_bytes=bound)
    for c in configs:
        cache.inputs(c)
        assert sum(p.stat().st_size for p in folder.glob("*.entry")) <= bound
    kept = [c for c in configs if cache.path(_inputs_key(c)).exists()]
    gone = [c for c in configs if c not in kept]
    # The most configs a byte: every entry kept is smaller than every one that went.
    assert kept and gone and max(map(size, kept)) <= min(map(size, gone))
    # A second run of the same configs in the same order keeps hitting on every one it kept.
    hits_before = cache.stats.hits
    for c in configs:
        cache.inputs(c)
    assert cache.stats.hits - hits_before == len(kept)
    # An entry unused for longer than IDLE_S goes before any larger one in use (seen as such
    # once the process counts the folder again: at once here).
    from sweeps import datacache

    cache.scan_s = 0.0

    idle = max(kept, key=size)
    old = time.time() - datacache.IDLE_S - 60
    os.utime(cache.path(_inputs_key(idle)), (old, old))
    newcomer = min(gone, key=size)
    cache.inputs(newcomer)
    assert not cache.path(_inputs_key(idle)).exists()
    assert cache.path(_inputs_key(newcomer)).exists() or size(newcomer) > size(idle)
    # An entry over an eighth of the bound is not stored at all.
    small = DataCache(tmp_path / "small", max(sizes.values()) * 4)
    big = max(configs, key=size)
    small.inputs(big)
    assert small.stats.skipped_large == 1 and not list((tmp_path / "small").glob("*.entry"))


def _write_many(folder: str, config_json: dict, rounds: int) -> None:
    cache = DataCache(Path(folder), 1 << 30)
    c = parse_config(config_json)
    for _ in range(rounds):
        cache._put(*_entry(cache, c))


def _entry(cache: DataCache, c):
    from sweeps.datacache import _key

    inputs = make_inputs(c)
    return _key(c, "inputs"), {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}, {"scalars": {
        k: v for k, v in inputs.items() if not isinstance(v, np.ndarray)}}


def test_two_processes_writing_one_key_leave_a_whole_entry(tmp_path):
    c = parse_config(dict(dtype="bf16", g=2, seq_len_q=4, seq_len_k=3000, num_heads_q=4, num_heads_kv=4,
                          head_dim_qk=64, head_dim_v=64, data_seed=9))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), c.to_dict(), 20)) for _ in range(2)]
    for p in procs:
        p.start()
    reader = DataCache(tmp_path, 1 << 30)
    want = make_inputs(c)
    reads = 0
    while any(p.is_alive() for p in procs):
        got, hit = reader.inputs(c)   # a miss writes too: a third writer
        assert_same_inputs(got, want)
        reads += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert reader.stats.corrupt == 0 and reads > 0
    assert reader.inputs(c)[1]
    assert not list(tmp_path.glob("*.tmp"))


def test_run_config_judges_alike_with_the_cache_cold_and_warm(tmp_path):
    cache = DataCache(tmp_path, 1 << 30)
    backend = CpuEmulationBackend()
    for c in sampled(12, seed=8):
        plain = run_config(c, backend)
        cold = run_config(c, backend, data=cache)
        warm = run_config(c, backend, data=cache)
        for r in (cold, warm):
            assert (r.outcome, r.failed_gate) == (plain.outcome, plain.failed_gate)
            assert r.metrics.keys() == plain.metrics.keys()
            for k, v in plain.metrics.items():   # bit for bit: NaN where NaN
                assert r.metrics[k] == v or (v != v and r.metrics[k] != r.metrics[k]), k
        if plain.outcome != "not_applicable":
            assert warm.timings["inputs_cached"] == 1.0 and warm.timings["reference_cached"] == 1.0
            assert cold.timings["reference_cached"] == 0.0


def test_the_settings_name_the_folder_and_the_off_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSWEEP_DATA_CACHE", str(tmp_path / "d"))
    monkeypatch.setenv("ATTNSWEEP_DATA_CACHE_BYTES", str(1 << 25))
    cache = DataCache.from_settings()
    assert cache.folder == tmp_path / "d" and cache.max_bytes == 1 << 25 and os.path.isdir(cache.folder)
    monkeypatch.delenv("ATTNSWEEP_DATA_CACHE")
    assert DataCache.from_settings() is None
    monkeypatch.setenv("ATTNSWEEP_DATA_CACHE_BYTES", "10")
    from pydantic import ValidationError
    from settings import Settings

    with pytest.raises(ValidationError, match="data_cache_bytes"):
        Settings()
