"""run --gpus: processes dealt round-robin over the GPUs, pinned, every config stored once."""
import pytest
from sqlalchemy import func, select

from store import repo
from store.db import session_scope, unit_of_work
from store.migrate import upgrade
from store.models import ConfigRun
from workers import embedded
from workers.embedded import execute_sweep
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec


def test_processes_are_dealt_round_robin_and_pinned_through_the_parents_mask():
    environ = {"CUDA_VISIBLE_DEVICES": "4,5"}
    seen = [embedded.worker_name(slot, (0, 1), environ) for slot in range(4)]
    assert seen == [("embedded-gpu4", 0), ("embedded-gpu5", 1)] * 2
    assert embedded.worker_name(0, ()) == ("embedded", None)


def test_entries_sharing_a_gpu_are_told_apart():
    names = [embedded.worker_name(slot, (0, 0), {})[0] for slot in range(2)]
    assert names == ["embedded-gpu0.0", "embedded-gpu0.1"]


def _sweep_over_gpus(url: str, samples: int, seed: int) -> tuple[int, dict[str, int]]:
    """A cpu sweep in two processes dealt over --gpus 0,1; its id and results per worker name."""
    upgrade(url)
    with session_scope(url) as s:
        sweep_id = repo.store_plan(s, plan_sweep(SweepSpec(samples=samples, seed=seed, backend="cpu"), device_total_memory=None, device=None)).id
    with unit_of_work(url) as session:
        execute_sweep(session, sweep_id, "cpu", jobs=2, gpus=[0, 1])
    with session_scope(url) as s:
        return sweep_id, repo.results_by_worker(s, sweep_id)


def test_a_sweep_over_two_gpus_stores_every_config_once_named_by_its_gpu(sqlite_url, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # children pin to 4 and 5
    sweep_id, by_worker = _sweep_over_gpus(sqlite_url, 12, 5)
    with session_scope(sqlite_url) as s:
        rows = s.scalar(select(func.count()).select_from(ConfigRun).where(ConfigRun.sweep_id == sweep_id))
        distinct = s.scalar(select(func.count(func.distinct(ConfigRun.config_hash))).where(ConfigRun.sweep_id == sweep_id))
        status = repo.sweep_status(s, sweep_id)
    assert status == "done"
    assert rows == distinct == 12 and sum(by_worker.values()) == 12
    assert set(by_worker) <= {"embedded-gpu4", "embedded-gpu5"}


def test_fewer_processes_than_gpu_entries_is_refused(sqlite_url):
    with pytest.raises(ValueError, match="--jobs 1: needs at least one process per --gpus entry"):
        list(embedded._results([], "cpu", frozenset(), 1, (0, 1)))


def test_pool_processes_take_the_parents_environment_of_the_moment_not_the_servers(sqlite_url, monkeypatch):
    # The fork server started before the mask was set (as `attnsweep run` starts it before it
    # plans); the processes it forks must still pin through the parent's mask of now.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    embedded.start_pool_server()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    _sweep_id, by_worker = _sweep_over_gpus(sqlite_url, 6, 9)
    assert sum(by_worker.values()) == 6 and set(by_worker) <= {"embedded-gpu6", "embedded-gpu7"}
