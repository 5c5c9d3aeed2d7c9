"""Run a stored sweep in this process (or a pool of local processes), storing every result.

The embedded mode of `attnsweep run`: no broker, no server. Results are written by this
process alone, one transaction per config, so an interrupted sweep keeps what it finished
and a re-run of the same sweep replaces rows instead of duplicating them.

With `gpus` (`run --gpus`), the pool's processes are dealt round-robin over the listed GPUs,
each pinned to its GPU before its backend loads a runtime; configs go to whichever process is
free, and each result is stored with the name of the GPU that ran it.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import Callable, Iterator

from attnconfig import parse_config
from kernels import get_backend
from kernels.backend import Backend
from kernels.devices import pin_gpu
from store import repo
from store.db import session_scope
from sweeps.result import ConfigResult
from sweeps.runner import run_config
from sweeps.threads import cap_blas_threads

_backend: Backend | None = None
_worker = "embedded"


def _init_worker(backend_name: str, defects: frozenset[str], gpus: tuple[int, ...] = (), counter=None) -> None:  # noqa: ANN001
    global _backend, _worker
    if gpus:
        with counter.get_lock():
            slot = counter.value
            counter.value += 1
        entry = slot % len(gpus)
        _worker = f"embedded-gpu{pin_gpu(gpus[entry])}"
        if len(set(gpus)) < len(gpus):  # several entries share a GPU: tell them apart
            _worker += f".{entry}"
    _backend = get_backend(backend_name, defects=defects)


def _run_one(config_json: dict) -> tuple[ConfigResult, str]:
    assert _backend is not None, "worker process not initialised"
    return run_config(parse_config(config_json), _backend), _worker


def _results(todo: list[dict], backend_name: str, defects: frozenset[str], jobs: int,
             gpus: tuple[int, ...] = ()) -> Iterator[tuple[ConfigResult, str]]:
    if jobs <= 1 and not gpus:
        _init_worker(backend_name, defects)
        for cfg in todo:
            yield _run_one(cfg)
        return
    if gpus and jobs < len(gpus):
        raise ValueError(f"--jobs {jobs}: needs at least one process per --gpus entry ({len(gpus)})")
    cap_blas_threads()  # jobs processes already fill the cores
    # spawn, not fork: a forked child inherits a parent's CUDA context in a broken state (and
    # pinning a GPU only works before the runtime loads, in a fresh process).
    ctx = mp.get_context("spawn")
    counter = ctx.Value("i", 0)
    with ctx.Pool(jobs, initializer=_init_worker, initargs=(backend_name, defects, tuple(gpus), counter)) as pool:
        yield from pool.imap_unordered(_run_one, todo, chunksize=1)


def execute_sweep(
    db_url: str,
    sweep_id: int,
    backend_name: str,
    defects: frozenset[str] = frozenset(),
    jobs: int = 1,
    on_result: Callable[[ConfigResult], None] | None = None,
    gpus: tuple[int, ...] | list[int] = (),
) -> None:
    with session_scope(db_url) as s:
        todo = [cfg for _hash, cfg in repo.queued_configs(s, sweep_id)]
        repo.set_status(s, sweep_id, "running")
    try:
        for result, worker in _results(todo, backend_name, defects, jobs, tuple(gpus)):
            t0 = time.perf_counter()
            with session_scope(db_url) as s:
                repo.record_result(s, sweep_id, result.config_hash, result.to_row(), worker=worker)
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
