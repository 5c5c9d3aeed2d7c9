"""Run a stored sweep in this process (or a pool of local processes), storing every result.

The embedded mode of `attnsweep run`: no broker, no server. Results are written by this
process alone, one transaction per config, so an interrupted sweep keeps what it finished
and a re-run of the same sweep replaces rows instead of duplicating them.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Callable, Iterator

from attnconfig import parse_config
from kernels import get_backend
from kernels.backend import Backend
from store import repo
from store.db import session_scope
from sweeps.result import ConfigResult
from sweeps.runner import run_config

_backend: Backend | None = None


def _init_worker(backend_name: str, defects: frozenset[str]) -> None:
    global _backend
    _backend = get_backend(backend_name, defects=defects)


def _run_one(config_json: dict) -> ConfigResult:
    assert _backend is not None, "worker process not initialised"
    return run_config(parse_config(config_json), _backend)


def _results(todo: list[dict], backend_name: str, defects: frozenset[str], jobs: int) -> Iterator[ConfigResult]:
    if jobs <= 1:
        _init_worker(backend_name, defects)
        for cfg in todo:
            yield _run_one(cfg)
        return
    # One BLAS thread per process: jobs processes already fill the cores.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    # spawn, not fork: a forked child inherits a parent's CUDA context in a broken state.
    ctx = mp.get_context("spawn")
    with ctx.Pool(jobs, initializer=_init_worker, initargs=(backend_name, defects)) as pool:
        yield from pool.imap_unordered(_run_one, todo, chunksize=1)


def execute_sweep(
    db_url: str,
    sweep_id: int,
    backend_name: str,
    defects: frozenset[str] = frozenset(),
    jobs: int = 1,
    on_result: Callable[[ConfigResult], None] | None = None,
) -> None:
    with session_scope(db_url) as s:
        todo = [cfg for _hash, cfg in repo.queued_configs(s, sweep_id)]
        repo.set_status(s, sweep_id, "running")
    try:
        for result in _results(todo, backend_name, defects, jobs):
            t0 = time.perf_counter()
            with session_scope(db_url) as s:
                repo.record_result(s, sweep_id, result.config_hash, result.to_row(), worker="embedded")
            # After the row is written, so not stored; bench/sweep.py reads it through on_result.
            result.timings["store_s"] = time.perf_counter() - t0
            if on_result:
                on_result(result)
    except BaseException as exc:
        with session_scope(db_url) as s:
            repo.set_status(s, sweep_id, "failed" if not isinstance(exc, KeyboardInterrupt) else "cancelled", error=repr(exc))
        raise
    with session_scope(db_url) as s:
        repo.set_status(s, sweep_id, "done")
