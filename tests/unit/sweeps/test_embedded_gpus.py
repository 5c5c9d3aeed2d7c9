"""run --gpus: processes dealt round-robin over the GPUs, pinned, every config stored once."""
import multiprocessing as mp
import os

import pytest
from sqlalchemy import func, select

from store import repo
from store.db import session_scope
from store.migrate import upgrade
from store.models import ConfigRun
from sweeps import embedded
from sweeps.embedded import execute_sweep
from sweeps.plan import plan_sweep
from sweeps.spec import SweepSpec


@pytest.fixture
def clean_worker_state(monkeypatch):
    monkeypatch.setattr(embedded, "_worker", "embedded")
    monkeypatch.setattr(embedded, "_backend", None)
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)


def test_processes_are_dealt_round_robin_and_pinned_through_the_parents_mask(clean_worker_state, monkeypatch):
    counter = mp.Value("i", 0)
    seen = []
    for _ in range(4):  # what four pool processes do in turn, each in a fresh environment
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
        monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
        embedded._init_worker("cpu", frozenset(), embedded.ProcessSettings(0, None), (0, 1), counter)
        seen.append((embedded._worker, os.environ["CUDA_VISIBLE_DEVICES"], os.environ["HIP_VISIBLE_DEVICES"]))
    assert seen == [("embedded-gpu4", "4", "4"), ("embedded-gpu5", "5", "5")] * 2


def test_entries_sharing_a_gpu_are_told_apart(clean_worker_state):
    counter = mp.Value("i", 0)
    names = []
    for _ in range(2):
        embedded._init_worker("cpu", frozenset(), embedded.ProcessSettings(0, None), (0, 0), counter)
        names.append(embedded._worker)
    assert names == ["embedded-gpu0.0", "embedded-gpu0.1"]


def _sweep_over_gpus(url: str, samples: int, seed: int) -> tuple[int, dict[str, int]]:
    """A cpu sweep in two processes dealt over --gpus 0,1; its id and results per worker name."""
    upgrade(url)
    with session_scope(url) as s:
        sweep_id, _ = plan_sweep(s, SweepSpec(samples=samples, seed=seed, backend="cpu"), device_total_memory=None, device=None)
    execute_sweep(url, sweep_id, "cpu", jobs=2, gpus=[0, 1])
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
