"""A sweep's triage in the store: computed after the sweep by the embedded runner, stored once,
served as the clusters report; a failed triage leaves the sweep done; a finished service sweep
owes one and publishes its task to the sweep's own queue."""
from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import func, select

from attnconfig import parse_config
from settings import Settings
from store import clusters as stored
from store import repo
from store.db import session_scope
from store.migrate import upgrade
from store.models import Cluster, Sweep, SweepTriage
from sweeps.spec import SweepSpec
from tests.unit.triage.sweeps import RANGES, run_at, triage_at
from workers.app import TASK_TRIAGE
from workers.execute import execute_batch
from workers.triage import publish_pending


def _defect_sweep(url: str, triage: bool, entered: list[int] | None = None) -> int:
    upgrade(url)

    @contextmanager
    def triaging(sweep_id: int):
        entered.append(sweep_id)
        yield

    return run_at(url, SweepSpec(samples=60, seed=5, backend="cpu", ranges=RANGES), backend="cpu",
                  device_total_memory=None, device=None, defects=frozenset({"causal_off_by_one"}),
                  triage=triage, triaging=triaging if entered is not None else None)


def _cluster_rows(url: str, sweep_id: int) -> list[tuple[int, str, int]]:
    with session_scope(url) as s:
        return [(c.id, c.signature, c.size) for c in stored.stored_clusters(s, sweep_id)]


def test_embedded_sweep_stores_its_clusters_once(sqlite_url):
    entered: list[int] = []
    sweep_id = _defect_sweep(sqlite_url, triage=True, entered=entered)
    assert entered == [sweep_id]
    with session_scope(sqlite_url) as s:
        report = stored.clusters_report(s, sweep_id)
        sweep_status = s.get(Sweep, sweep_id).status
        row = s.get(SweepTriage, sweep_id)
    assert sweep_status == "done" and report["status"] == "done" and row.runs and row.finished_at is not None
    assert len(report["clusters"]) == 1
    c = report["clusters"][0]
    assert c["explanation"]["conditions"] == ["causal=true"]
    assert c["classification"]["kind"] == "deterministic"
    assert c["signature"]["outcome"] in ("fail", "nan") and c["size"] == len(c["config_hashes"]) > 0
    minimal = parse_config(c["minimal_config"])
    assert minimal.causal and c["reproducer"].startswith("attnsweep verify --backend cpu")
    assert minimal.to_compact_json() in c["reproducer"] and "--defect causal_off_by_one" in c["reproducer"]

    before = _cluster_rows(sqlite_url, sweep_id)
    assert triage_at(sqlite_url, sweep_id) == "done"       # claimed already: nothing computed again
    assert _cluster_rows(sqlite_url, sweep_id) == before
    assert triage_at(sqlite_url, sweep_id, force=True) == "done"  # recomputed: replaced, not added
    again = _cluster_rows(sqlite_url, sweep_id)
    assert [(sig, n) for _i, sig, n in again] == [(sig, n) for _i, sig, n in before]
    with session_scope(sqlite_url) as s:
        assert s.scalar(select(func.count()).select_from(Cluster).where(Cluster.sweep_id == sweep_id)) == 1


def test_a_failing_triage_is_stored_failed_and_the_sweep_stays_done(sqlite_url):
    sweep_id = _defect_sweep(sqlite_url, triage=False)
    with session_scope(sqlite_url) as s:
        assert stored.triage_status(s, sweep_id) == "none"   # an ended sweep nobody triaged
    assert triage_at(sqlite_url, sweep_id, backend="no-such-backend") == "failed"
    with session_scope(sqlite_url) as s:
        report = stored.clusters_report(s, sweep_id)
        assert s.get(Sweep, sweep_id).status == "done"
    assert report["status"] == "failed" and report["clusters"] == [] and "no-such-backend" in report["error"]


def test_claim_takes_pending_and_stale_rows_only(sqlite_url):
    upgrade(sqlite_url)
    with session_scope(sqlite_url) as s:
        sid = repo.create_sweep(s, request={}, seed=1, backend="cpu", label=None, splitkv_budget=1, budget_source="x",
                                device=None, draws=0, filtered={}, configs=[]).id
        assert stored.triage_status(s, sid) == "pending"   # queued: its triage follows its end
        assert stored.request_triage(s, sid) and not stored.request_triage(s, sid)
        assert stored.claim_triage(s, sid, stale_after_s=3600)
        assert not stored.claim_triage(s, sid, stale_after_s=3600)   # running, fresh
        assert stored.claim_triage(s, sid, stale_after_s=0)          # running, its worker gone
        stored.store_clusters(s, sid, [])
        assert not stored.claim_triage(s, sid, stale_after_s=0)      # done
        assert stored.claim_triage(s, sid, stale_after_s=0, force=True)


class _Broker:
    """What a Celery app's send_task is given, kept (the publication, not Celery, is under test)."""

    def __init__(self, refuse: bool = False) -> None:
        self.sent: list[tuple[str, tuple, str]] = []
        self.refuse = refuse

    def send_task(self, name: str, args: tuple, queue: str, **_options) -> None:
        if self.refuse:
            raise ConnectionError("broker away")
        self.sent.append((name, args, queue))


def test_the_batch_that_ends_a_sweep_publishes_its_triage_to_its_queue(sqlite_url):
    upgrade(sqlite_url)
    settings = Settings(database_url=sqlite_url, queue_prefix="t-")
    config = parse_config(dict(dtype="f16", g=1, seq_len_q=8, seq_len_k=64, num_heads_q=2, num_heads_kv=1,
                               head_dim_qk=32, head_dim_v=32))
    with session_scope(sqlite_url) as s:
        sid = repo.create_sweep(s, request={}, seed=1, backend="cpu", label=None, splitkv_budget=1 << 30,
                                budget_source="fallback", device=None, draws=1, filtered={}, configs=[config]).id
    refused = _Broker(refuse=True)
    execute_batch(settings, sid, [(config.content_hash(), config.to_dict())], "cpu", celery=refused)
    with session_scope(sqlite_url) as s:
        assert stored.triage_status(s, sid) == "pending" and stored.unpublished(s) == [sid]
    broker = _Broker()
    with session_scope(sqlite_url) as s:   # the reconciler's pass
        assert publish_pending(s, broker, settings) == 1
        assert stored.unpublished(s) == []
    assert broker.sent == [(TASK_TRIAGE, (sid,), "t-cpu")]
    assert triage_at(sqlite_url, sid, settings) == "done"
    with session_scope(sqlite_url) as s:
        assert stored.clusters_report(s, sid) == {"status": "done", "error": None, "clusters": []}


def test_an_interrupted_triage_goes_back_to_pending_and_runs_again(sqlite_url, monkeypatch):
    """SIGTERM to a worker's process group ends its triage with SystemExit: no verdict, so the
    triage is pending and unpublished again (the reconciler publishes it), then runs to done."""
    import triage.sweep

    sweep_id = _defect_sweep(sqlite_url, triage=False)
    real = triage.sweep.triage_sweep

    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003
        raise SystemExit(-15)

    monkeypatch.setattr(triage.sweep, "triage_sweep", interrupted)
    try:
        triage_at(sqlite_url, sweep_id)
    except SystemExit:
        pass
    else:
        raise AssertionError("the interruption was swallowed")
    with session_scope(sqlite_url) as s:
        assert stored.triage_status(s, sweep_id) == "pending"
        assert stored.unpublished(s) == [sweep_id]
    monkeypatch.setattr(triage.sweep, "triage_sweep", real)
    assert triage_at(sqlite_url, sweep_id) == "done"
