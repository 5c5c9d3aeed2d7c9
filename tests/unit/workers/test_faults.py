"""A faulting or hanging kernel costs its own configs only, in the embedded pool (cpu emulation).

The cpu emulation models the fault defects of the combine kernel (split_kv > 1): oob_store as a
sticky device fault that leaves its process's emulated context unusable, oob_store_small as a
store into O's guard zone, hang as a loop only the time limit ends. Every other config must
come out exactly as it does without the defect.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sqlalchemy import func, select

from kernels.guards import CANARY, GUARD_BYTES, check_guards, padded_bytes
from store.db import session_scope, unit_of_work
from store.migrate import upgrade
from store.models import ConfigRun
from store import repo
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec
from tests.integration.conftest import ROOT
from workers.embedded import execute_sweep

SPEC = dict(samples=24, seed=11, backend="cpu", ranges={"seq_len_k": [1, 512], "seq_len_q": [1, 16]})


def _sweep(url: str, defects: frozenset[str] = frozenset(), **kwargs) -> dict[str, tuple[str, int, str]]:
    """config hash -> (outcome, split_kv, detail) of a fresh sweep of SPEC, every row checked stored once."""
    upgrade(url)
    with session_scope(url) as s:
        sweep_id = repo.store_plan(s, plan_sweep(SweepSpec(**SPEC), device_total_memory=None, device=None)).id
    with unit_of_work(url) as session:
        execute_sweep(session, sweep_id, "cpu", defects=defects, **kwargs)
    with session_scope(url) as s:
        rows = s.execute(select(ConfigRun.config_hash, ConfigRun.outcome, ConfigRun.split_kv, ConfigRun.detail,
                                ConfigRun.attempts, ConfigRun.state).where(ConfigRun.sweep_id == sweep_id)).all()
        assert s.scalar(select(func.count(func.distinct(ConfigRun.config_hash))).where(ConfigRun.sweep_id == sweep_id)) == 24
    assert len(rows) == 24 and {(r.state, r.attempts) for r in rows} == {("done", 1)}   # each stored once
    return {r.config_hash: (r.outcome, r.split_kv, r.detail or "") for r in rows}


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict[str, tuple[str, int, str]]:
    return _sweep(f"sqlite:///{tmp_path_factory.mktemp('clean') / 'a.db'}", jobs=2)


@pytest.mark.timeout(180)
def test_a_sticky_fault_costs_only_the_configs_that_take_the_faulting_path(tmp_path, clean):
    got = _sweep(f"sqlite:///{tmp_path / 'a.db'}", frozenset({"oob_store"}), jobs=2)
    faulted = {h for h, (outcome, _s, _d) in got.items() if outcome == "fault"}
    combined = {h for h, (_o, split_kv, _d) in got.items() if split_kv > 1}
    assert faulted == combined and 0 < len(faulted) < 24
    assert {got[h][0] for h in set(got) - faulted} == {"pass"}
    assert {h: clean[h][0] for h in set(got) - faulted} == {h: "pass" for h in set(got) - faulted}
    assert all("ILLEGAL_ADDRESS" in got[h][2] and "oob_store" in got[h][2] for h in faulted)


@pytest.mark.timeout(180)
def test_a_store_into_the_guard_zone_is_a_fault_naming_the_buffer_and_offset(tmp_path, clean):
    got = _sweep(f"sqlite:///{tmp_path / 'a.db'}", frozenset({"oob_store_small"}), jobs=1)
    faulted = {h for h, (outcome, _s, _d) in got.items() if outcome == "fault"}
    assert faulted == {h for h, (_o, split_kv, _d) in got.items() if split_kv > 1}
    assert all("store outside o" in got[h][2] and "past its end" in got[h][2] for h in faulted)
    # With partials, O's one writer is the combine: the detail names it (triage locates it there).
    assert all("attn_splitkv_combine is the one kernel of the call given o" in got[h][2] for h in faulted)
    assert {got[h][0] for h in set(got) - faulted} == {"pass"}


@pytest.mark.timeout(240)
def test_a_hanging_kernel_is_a_timeout_and_the_rest_of_the_sweep_runs(tmp_path, clean):
    # A limit that the slowest config of SPEC on a loaded 2-core machine stays well under.
    got = _sweep(f"sqlite:///{tmp_path / 'a.db'}", frozenset({"hang"}), jobs=2, time_limit_s=4.0)
    timed_out = {h for h, (outcome, _s, _d) in got.items() if outcome == "timeout"}
    assert timed_out == {h for h, (_o, split_kv, _d) in got.items() if split_kv > 1}
    assert {got[h][0] for h in set(got) - timed_out} == {"pass"}
    assert all("time limit of 4 s" in got[h][2] for h in timed_out)
    assert all("stopped in attn_splitkv_combine" in got[h][2] for h in timed_out)


def test_guard_check_names_the_side_offset_and_bytes():
    nbytes = 10
    raw = np.full(padded_bytes(nbytes), CANARY, dtype=np.uint8)
    assert check_guards("o", raw, nbytes, 2) is None
    raw[GUARD_BYTES + nbytes + 4:GUARD_BYTES + nbytes + 6] = 0
    after = check_guards("o", raw, nbytes, 2)
    assert (after.side, after.offset, after.changed) == ("after", 4, 2)
    assert "store outside o: 2 bytes of the guard after it changed, the nearest 4 bytes past its end" in after.describe()
    assert after.describe(["attn_splitkv_combine"]).endswith("; attn_splitkv_combine is the one kernel of the call given o")
    assert after.describe(["attn_splitkv_fwd", "attn_splitkv_combine"]).endswith(
        "; the kernels of the call given o: attn_splitkv_fwd, attn_splitkv_combine")
    raw[:] = CANARY
    raw[GUARD_BYTES - 3] = 1
    before = check_guards("lse", raw, nbytes, 4)
    assert (before.side, before.offset, before.changed) == ("before", -3, 1)
    raw[:] = CANARY
    raw[GUARD_BYTES:GUARD_BYTES + nbytes] = 7   # the buffer itself is the kernel's to write
    assert check_guards("o", raw, nbytes, 2) is None


def test_a_race_defect_is_refused_on_the_cpu_emulation_with_the_reason():
    from kernels import get_backend

    with pytest.raises(ValueError, match="missing_barrier is a race between GPU threads"):
        get_backend("cpu", defects={"missing_barrier"})


@pytest.mark.parametrize("args, message", [
    (["--sanitize", "memcheck"], "error: --sanitize: the cpu backend emulates the kernels in numpy"),
    (["--sanitize", "leakcheck"], "error: --sanitize: 'leakcheck' is not a compute-sanitizer tool"),
])
def test_run_refuses_sanitize_on_cpu_in_one_line(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--backend", "cpu", "--samples", "2",
                           "--db", str(tmp_path / "x.db"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    said = proc.stdout + proc.stderr
    assert message in " ".join(said.split()), said
    assert "Traceback" not in said
