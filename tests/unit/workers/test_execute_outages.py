"""A batch against a store that refuses writes, and against another worker that got there first:
the outcome comes only from running the config, a stored result is final, and only a process
that dies while its config's kernel runs counts towards the poison-config rule."""
from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from settings import Settings
from store import repo
from store.db import session_scope
from tests.unit.workers.test_execute import BASE, _rows, _status, _sweep
from workers import execute
from workers.execute import MAX_STARTS, ResultsNotStored, execute_batch


class DiskFull(Exception):
    """Stands in for psycopg's DiskFull, which SQLAlchemy raises as OperationalError."""


def refuse_writes(monkeypatch, times: int) -> list[int]:
    """repo.record_result raises OperationalError (could not extend file: No space left on
    device) its first `times` calls, as PostgreSQL does while its disk is full; then writes."""
    real, calls = repo.record_result, []

    def record_result(*args, **kwargs):  # noqa: ANN002, ANN003
        calls.append(1)
        if len(calls) <= times:
            raise OperationalError("UPDATE config_runs ...", {}, DiskFull("could not extend file: No space left on device"))
        return real(*args, **kwargs)

    monkeypatch.setattr(repo, "record_result", record_result)
    monkeypatch.setattr(execute, "WRITE_RETRY_MAX_DELAY_S", 0.01)
    monkeypatch.setattr(execute.time, "sleep", lambda s: None)
    return calls


def _starts(url: str, sid: int) -> list[int]:
    return [r.starts for _seq, r in sorted(_rows(url, sid).items())]


def test_a_refused_write_is_retried_in_process_and_the_result_stored_once(sqlite_url, monkeypatch, caplog):
    calls = refuse_writes(monkeypatch, 5)
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE])
    with caplog.at_level(logging.WARNING, logger="workers.execute"):
        assert execute_batch(settings, sid, items, "cpu") == {"pass": 1}
    assert len(calls) == 6
    row = _rows(sqlite_url, sid)[0]
    assert (row.outcome, row.attempts, row.starts) == ("pass", 1, 0)   # stored once, its start mark cleared
    assert _status(sqlite_url, sid).status == "done"
    assert "the database refused it (OperationalError" in caplog.text


def test_a_store_refusing_past_the_budget_never_turns_into_an_error_outcome(sqlite_url, monkeypatch):
    """The batch goes back to Celery naming the config whose kernel came back; however often that
    happens, its next run is not counted as a process death."""
    refuse_writes(monkeypatch, 4 * (MAX_STARTS + 1))
    monkeypatch.setattr(execute, "WRITE_RETRY_S", 0.0)   # every refusal hands the batch back
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE])
    returned: list[str] = []
    for _ in range(4 * (MAX_STARTS + 1)):
        with pytest.raises(ResultsNotStored) as raised:
            execute_batch(settings, sid, items, "cpu", returned=returned)
        returned = sorted(set(returned) | set(raised.value.returned))
        assert returned == [items[0][0]] and _starts(sqlite_url, sid) == [1]
    assert execute_batch(settings, sid, items, "cpu", returned=returned) == {"pass": 1}
    row = _rows(sqlite_url, sid)[0]
    assert (row.outcome, row.starts) == ("pass", 0)


def test_process_deaths_in_a_kernel_still_make_a_poison_config_an_error(sqlite_url):
    """Marks left by runs that never came back (the process died in the kernel) are deaths."""
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE])
    for _ in range(MAX_STARTS):
        with session_scope(sqlite_url) as s:
            repo.begin_config(s, sid, items[0][0])
    assert execute_batch(settings, sid, items, "cpu") == {"error": 1}
    row = _rows(sqlite_url, sid)[0]
    assert row.outcome == "error" and f"{MAX_STARTS} worker processes ended while running" in row.detail


def test_a_config_stored_by_another_worker_meanwhile_is_skipped(sqlite_url, monkeypatch):
    """The batch read its queued configs, then was stopped past its lease while another worker
    ran the batch: the configs that worker stored are skipped, not run again."""
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE, {**BASE, "data_seed": 1}])
    real_run = execute.ConfigExecutor.run

    def run(self, config, gates, on_hard_timeout, drawn=None):  # noqa: ANN001
        with session_scope(sqlite_url) as s:   # the other worker stores the second config
            repo.record_result(s, sid, items[1][0], {"outcome": "pass", "detail": "other"}, worker="other")
        return real_run(self, config, gates, on_hard_timeout, drawn)

    monkeypatch.setattr(execute.ConfigExecutor, "run", run)
    assert execute_batch(settings, sid, items, "cpu", worker="me") == {"pass": 1, "skipped": 1}
    rows = _rows(sqlite_url, sid)
    assert [(rows[i].worker, rows[i].attempts) for i in range(2)] == [("me", 1), ("other", 1)]


def test_a_late_result_is_discarded_and_logged(sqlite_url, monkeypatch, caplog):
    """Another worker stored the config while this one ran it: first write wins."""
    settings = Settings(database_url=sqlite_url)
    sid, items = _sweep(sqlite_url, [BASE])
    real_run = execute.ConfigExecutor.run

    def run(self, config, gates, on_hard_timeout, drawn=None):  # noqa: ANN001
        result = real_run(self, config, gates, on_hard_timeout, drawn)
        with session_scope(sqlite_url) as s:
            repo.record_result(s, sid, items[0][0], {"outcome": "fail", "detail": "first"}, worker="other")
        return result

    monkeypatch.setattr(execute.ConfigExecutor, "run", run)
    with caplog.at_level(logging.WARNING, logger="workers.execute"):
        assert execute_batch(settings, sid, items, "cpu", worker="me") == {"late": 1}
    row = _rows(sqlite_url, sid)[0]
    assert (row.outcome, row.detail, row.worker, row.attempts) == ("fail", "first", "other", 2)
    assert "another worker stored it first" in caplog.text and "(pass) discarded" in caplog.text
