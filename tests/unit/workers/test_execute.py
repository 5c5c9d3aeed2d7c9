"""A worker's batch on the real cpu backend and a SQLite store: results, skips, time limits, sweep states."""
from __future__ import annotations

import threading
import time

import pytest

from attnconfig import parse_config
from settings import Settings
from store import repo
from store.db import session_scope
from store.migrate import upgrade
from store.models import ConfigRun, Sweep
from workers.execute import execute_batch
from isolation.executor import WATCHDOG_EXIT
from isolation.timelimit import ConfigTimeLimitExceeded, time_limit

BASE = dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=64, num_heads_q=2, num_heads_kv=1, head_dim_qk=32, head_dim_v=32)
# About a second on two cores once warm (more when cold): far over the 50 ms limits below.
HEAVY = dict(dtype="f32", g=4, seq_len_q=512, seq_len_k=2048, num_heads_q=8, num_heads_kv=8, head_dim_qk=128, head_dim_v=128)
MEDIUM = {**HEAVY, "g": 1}  # about a quarter of a second warm: ten times the watchdog's 20 ms


def _sweep(url: str, configs: list[dict]) -> tuple[int, list]:
    upgrade(url)
    parsed = [parse_config(c) for c in configs]
    with session_scope(url) as s:
        sid = repo.create_sweep(s, request={}, seed=1, backend="cpu", label="w", splitkv_budget=1 << 30,
                                budget_source="fallback", device=None, draws=len(parsed), filtered={}, configs=parsed).id
    return sid, [(c.content_hash(), c.to_dict()) for c in parsed]


def _rows(url: str, sid: int) -> dict[int, ConfigRun]:
    from sqlalchemy import select

    with session_scope(url) as s:
        return {r.seq: r for r in s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sid))}


def _status(url: str, sid: int) -> Sweep:
    with session_scope(url) as s:
        return s.get(Sweep, sid)


def test_batch_records_each_result_and_moves_the_sweep_to_done(sqlite_url):
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE, {**BASE, "data_seed": 1}, {**BASE, "rms_threshold": 1e-30}])
    first = execute_batch(settings, sid, items[:2], "cpu", worker="w@h")
    assert first == {"pass": 2}
    mid = _status(sqlite_url, sid)
    assert mid.status == "running" and mid.started_at is not None and mid.finished_at is None
    second = execute_batch(settings, sid, items[2:], "cpu", worker="w@h")
    assert second == {"fail": 1}
    rows = _rows(sqlite_url, sid)
    assert [rows[i].outcome for i in range(3)] == ["pass", "pass", "fail"]
    assert rows[2].failed_gate == "rms" and rows[2].reproducer.startswith("attnsweep verify --backend cpu")
    assert {r.worker for r in rows.values()} == {"w@h"} and {r.state for r in rows.values()} == {"done"}
    done = _status(sqlite_url, sid)
    assert done.status == "done" and done.finished_at is not None


def test_a_batch_delivered_twice_skips_what_is_recorded(sqlite_url):
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE, {**BASE, "data_seed": 1}])
    assert execute_batch(settings, sid, items[:1], "cpu") == {"pass": 1}
    assert execute_batch(settings, sid, items, "cpu") == {"skipped": 1, "pass": 1}
    assert {r.attempts for r in _rows(sqlite_url, sid).values()} == {1}
    assert execute_batch(settings, sid, items, "cpu") == {"skipped": 2}
    assert _status(sqlite_url, sid).status == "done"


def test_cancelled_sweep_runs_nothing_more(sqlite_url):
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE, {**BASE, "data_seed": 1}, {**BASE, "data_seed": 2}])
    execute_batch(settings, sid, items[:1], "cpu")
    with session_scope(sqlite_url) as s:
        assert repo.cancel_sweep(s, sid) == 2
    assert execute_batch(settings, sid, items[1:], "cpu") == {"skipped": 2}
    rows = _rows(sqlite_url, sid)
    assert [rows[i].state for i in range(3)] == ["done", "cancelled", "cancelled"]
    assert _status(sqlite_url, sid).status == "cancelled"


def test_config_over_the_time_limit_is_recorded_timeout_and_the_batch_moves_on(sqlite_url):
    settings = Settings(database_url=sqlite_url, config_time_limit_s=0.05, config_time_grace_s=60)
    sid, items = _sweep(sqlite_url, [HEAVY, BASE])
    t0 = time.perf_counter()
    counts = execute_batch(settings, sid, items, "cpu")
    assert counts == {"timeout": 1, "pass": 1}
    assert time.perf_counter() - t0 < 30
    rows = _rows(sqlite_url, sid)
    assert rows[0].outcome == "timeout" and "time limit of 0.05 s" in rows[0].detail
    assert rows[0].reproducer.startswith("attnsweep verify") and rows[0].total_s >= 0.05
    assert rows[1].outcome == "pass"
    assert _status(sqlite_url, sid).status == "done"


def test_watchdog_records_timeout_and_ends_the_process_when_the_config_never_yields(sqlite_url):
    """Off the main thread there is no SIGALRM: only the watchdog can stop the config."""
    settings = Settings(database_url=sqlite_url, config_time_limit_s=0.01, config_time_grace_s=0.01)
    sid, items = _sweep(sqlite_url, [MEDIUM])
    exited = threading.Event()
    codes: list[int] = []
    seen: list[str | None] = []

    def fake_exit(code: int) -> None:  # stands in for os._exit: record what the watchdog left behind
        codes.append(code)
        seen.append(_rows(sqlite_url, sid)[0].outcome)
        exited.set()

    worker = threading.Thread(target=execute_batch, args=(settings, sid, items, "cpu"), kwargs={"exit_process": fake_exit})
    worker.start()
    assert exited.wait(60), "the watchdog never fired"
    worker.join(120)
    assert codes == [WATCHDOG_EXIT]
    assert seen == ["timeout"]


def test_time_limit_raises_in_the_main_thread_and_cancels_cleanly():
    fired = []
    with pytest.raises(ConfigTimeLimitExceeded, match="0.02 s"):
        with time_limit(0.02, 5.0, lambda: fired.append(1)):
            time.sleep(1)
    with time_limit(0.5, 0.01, lambda: fired.append(1)):
        pass
    time.sleep(0.7)
    assert fired == []  # neither the alarm nor the watchdog outlives the block


def test_unknown_gpu_backend_on_this_worker_is_an_error_result(sqlite_url):
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE])
    assert execute_batch(settings, sid, items, "hip") == {"error": 1}
    row = _rows(sqlite_url, sid)[0]
    assert "backend hip unavailable" in row.detail and row.backend == "hip"
