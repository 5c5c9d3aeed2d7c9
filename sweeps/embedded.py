"""Run a stored sweep in this process (or a pool of local processes), storing every result.

The embedded mode of `attnsweep run`: no broker, no server. Results are written by this
process alone, one transaction per batch of the results that are in (one config, unless the
pool finishes them faster than a transaction: its last, smallest configs finish hundreds a
second, and with a transaction each the parent fell seconds behind at the end). An interrupted
sweep keeps what it committed, its other configs stay queued and run again, and a re-run of
the same sweep replaces rows instead of duplicating them.

With `gpus` (`run --gpus`), the pool's processes are dealt round-robin over the listed GPUs,
each pinned to its GPU before its backend loads a runtime; configs go to whichever process is
free, and each result is stored with the name of the GPU that ran it.

A process loads its backend (a GPU context: a second or more while a pool's processes all start
at once) in a thread, and meanwhile draws its first config's inputs.

A pool takes the costliest configs first (host_cost: the reference's flops and the inputs it
draws): a config's cost spans four orders of magnitude, and one large config drawn last keeps
one process busy while the others idle.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, NamedTuple

from attnconfig import parse_config
from core.settings import Settings
from kernels import get_backend
from kernels.backend import Backend
from kernels.devices import pin_gpu
from reference import make_inputs
from store import repo
from store.db import session_scope
from sweeps.filters import host_cost
from sweeps.heap import retain_freed_memory
from sweeps.result import ConfigResult
from sweeps.runner import run_config
from sweeps.threads import cap_blas_threads

STORE_BATCH_MAX = 64  # results in one transaction at most
_backend: Future[Backend] | None = None
_worker = "embedded"
_ready_at = 0.0
_overlap: bool | None = None


class ProcessSettings(NamedTuple):
    """What a computing process takes from core.settings, read in the parent: a setting that
    does not validate fails the sweep there, where in a pool's initializer it would restart the
    process forever."""

    heap_retain_mb: int
    overlap: bool | None  # run_config's overlap: None lets the backend decide, False never

    @classmethod
    def now(cls) -> "ProcessSettings":
        settings = Settings()  # not get_settings' cache: the environment may have changed since
        return cls(settings.heap_retain_mb, None if settings.overlap_device else False)


def _init_worker(backend_name: str, defects: frozenset[str], process: ProcessSettings, gpus: tuple[int, ...] = (),
                 counter=None, environ: dict[str, str] | None = None) -> None:  # noqa: ANN001
    global _backend, _worker, _ready_at, _overlap
    if environ is not None:  # the parent's environment now, not the fork server's at its start
        os.environ.clear()
        os.environ.update(environ)
    retain_freed_memory(process.heap_retain_mb)
    _overlap = process.overlap
    if gpus:
        with counter.get_lock():
            slot = counter.value
            counter.value += 1
        entry = slot % len(gpus)
        _worker = f"embedded-gpu{pin_gpu(gpus[entry])}"
        if len(set(gpus)) < len(gpus):  # several entries share a GPU: tell them apart
            _worker += f".{entry}"
    # The pin above is set before the thread starts: the runtime reads it when it loads.
    _backend = ThreadPoolExecutor(1, thread_name_prefix="backend").submit(get_backend, backend_name, defects=defects)
    _backend.add_done_callback(_mark_ready)


def _mark_ready(_future: Future) -> None:
    global _ready_at
    _ready_at = time.time()


def _run_one(config_json: dict) -> tuple[ConfigResult, str]:
    assert _backend is not None, "worker process not initialised"
    began = time.time()
    config = parse_config(config_json)
    drawn = None
    if not _backend.done():  # numpy's generator and the driver's calls run outside the GIL
        t0 = time.perf_counter()
        inputs = make_inputs(config)
        drawn = (inputs, time.perf_counter() - t0)
    # A backend that failed to load raises here, in the task: the sweep fails with its error
    # (in a pool initializer it would restart the process forever).
    result = run_config(config, _backend.result(), drawn=drawn, overlap=_overlap)
    drawn = None  # freed before the memory below is read
    # Not stored: epoch times that line up the pool's processes (bench/sweep.py shows where a
    # pool idles: starting, between configs, in the tail), and the process's memory: its peak,
    # and what stays resident once the config's arrays are freed (sweeps/heap.py keeps some).
    result.timings.update(pid=float(os.getpid()), ready_at=_ready_at, began_at=began, **_memory_mb())
    return result, _worker


def _memory_mb() -> dict[str, float]:
    try:
        import resource

        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        now = resident / 2**20
        # The kernel's high-water mark trails the resident count by its per-thread caches.
        return {"rss_peak_mb": max(now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "rss_mb": now}
    except (ImportError, OSError):  # not Linux
        return {}


def _pool_context() -> mp.context.BaseContext:
    """Not fork: a forked child inherits a parent's CUDA context in a broken state (and pinning
    a GPU only works before the runtime loads). A fork server is a fresh process that loads no
    GPU runtime: it imports numpy, the reference and the runner once, and each pool process
    forks from it in milliseconds, where a spawned one spends seconds importing them again (all
    of them at once). Each takes the parent's environment of the moment (_init_worker's
    `environ`): the server keeps the one it started with."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["sweeps.embedded"])
    return ctx


def start_pool_server() -> None:
    """Start the fork server now, so that its imports run while the caller plans the sweep (a
    no-op where processes spawn). The BLAS cap goes first: the server's numpy keeps it."""
    cap_blas_threads()
    if _pool_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def largest_first(todo: list[dict]) -> list[dict]:
    """The configs by decreasing host_cost (ties in the given order): longest processing time
    first, the list-scheduling order whose last finisher waits least."""
    costs = [host_cost(parse_config(cfg)) for cfg in todo]
    return [todo[i] for i in sorted(range(len(todo)), key=lambda i: -costs[i])]


def _results(todo: list[dict], backend_name: str, defects: frozenset[str], jobs: int,
             gpus: tuple[int, ...] = ()) -> Iterator[list[tuple[ConfigResult, str]]]:
    """Batches of (result, worker name): each holds the results that were in when it was taken."""
    process = ProcessSettings.now()
    if jobs <= 1 and not gpus:
        _init_worker(backend_name, defects, process)
        for cfg in todo:
            yield [_run_one(cfg)]
        return
    if gpus and jobs < len(gpus):
        raise ValueError(f"--jobs {jobs}: needs at least one process per --gpus entry ({len(gpus)})")
    cap_blas_threads()  # jobs processes already fill the cores
    todo = largest_first(todo)
    ctx = _pool_context()
    counter = ctx.Value("i", 0)
    initargs = (backend_name, defects, process, tuple(gpus), counter, dict(os.environ))
    with ctx.Pool(jobs, initializer=_init_worker, initargs=initargs) as pool:
        results = pool.imap_unordered(_run_one, todo, chunksize=1)
        for first in results:
            batch = [first]
            while len(batch) < STORE_BATCH_MAX:
                try:
                    batch.append(results.next(timeout=0))
                except (mp.TimeoutError, StopIteration):
                    break
            yield batch


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
        for batch in _results(todo, backend_name, defects, jobs, tuple(gpus)):
            t0 = time.perf_counter()
            with session_scope(db_url) as s:
                repo.record_results(s, sweep_id, [(r.config_hash, r.to_row(), worker) for r, worker in batch])
            # After the rows are written, so not stored; bench/sweep.py reads it through on_result.
            store_s = (time.perf_counter() - t0) / len(batch)
            for result, _worker_name in batch:
                result.timings["store_s"] = store_s
                if on_result:
                    on_result(result)
    except BaseException as exc:
        with session_scope(db_url) as s:
            repo.set_status(s, sweep_id, "failed" if not isinstance(exc, KeyboardInterrupt) else "cancelled", error=repr(exc))
        raise
    with session_scope(db_url) as s:
        repo.set_status(s, sweep_id, "done")
