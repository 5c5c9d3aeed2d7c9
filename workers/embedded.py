"""Run a stored sweep on this machine without a broker: worker processes, every result stored here.

The embedded mode of `attnsweep run`: no broker, no server. Configs run in `jobs` worker
processes (one at least: a config that faults must never take the process that stores the
results with it), each through isolation.executor.ConfigExecutor as in a Celery worker. This
process hands each idle worker its next config, stores the results, one transaction per batch of
the results that are in (one config, unless the pool finishes them faster than a transaction: its
last, smallest configs finish hundreds a second), and replaces a worker process that ends:
- after a device fault that left its context unusable (it stores the `fault` and exits);
- after the per-config watchdog ended a config stuck in a driver call (it stores `timeout`);
- when it dies on its own (killed, a crash in a driver): its config runs again in the new
  process, and is stored as `error` once MAX_STARTS processes have died in it;
- when a config outlives the time limit, its grace and KILL_MARGIN_S (the watchdog itself
  stuck): this process kills it and stores `timeout`.
Every other config, the dead process's queue included, runs on a fresh context and is stored
exactly once. An interrupted sweep keeps what it committed, its other configs stay queued and
run again, and a re-run of the same sweep replaces rows instead of duplicating them.

With `gpus` (`run --gpus`), worker i is pinned to entry i mod len(gpus), before its backend
loads a runtime, and each result is stored with the name of the GPU that ran it.

A process loads its backend (a GPU context: a second or more while a pool's processes all start
at once) in a thread, and meanwhile draws its first config's inputs.

The costliest configs go first (host_cost: the reference's flops and the inputs it draws): a
config's cost spans four orders of magnitude, and one large config drawn last keeps one process
busy while the others idle.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Callable, Iterator

from attnconfig import parse_config
from isolation.executor import ConfigExecutor, Limits
from isolation.unrun import unrun_result
from kernels.backends.base import Backend
from kernels.devices import pin_gpu
from reference import make_inputs
from settings import Settings
from kernels.source import KernelSource
from store import repo
from store.bundles import load_bundle
from store.db import Session
from store.kernels import note_kernel, sweep_kernel
from sweeps.datacache import DataCache
from sweeps.filters import host_cost
from sweeps.policy import gates_for
from sweeps.result import ConfigResult
from workers.threads import cap_blas_threads

STORE_BATCH_MAX = 64   # results in one transaction at most
MAX_STARTS = 3         # processes that may die in one config before it is stored as `error`
KILL_MARGIN_S = 30.0   # past limit + grace, the watchdog itself is stuck: the process is killed


def process_limits(time_limit_s: float | None = None) -> Limits:
    """The per-config limits the computing processes take from the settings, read here in the
    parent: a setting that does not validate fails the sweep here, not in every worker process.
    `time_limit_s` replaces the setting's per-config limit."""
    settings = Settings()  # not get_settings' cache: the environment may have changed since
    limits = Limits.of(settings)
    return limits if time_limit_s is None else Limits(time_limit_s, limits.grace_s)


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process runs: the sweep's kind and its place among the GPUs."""

    backend_name: str
    defects: frozenset[str]
    limits: Limits
    name: str = "embedded"
    gpu: int | None = None
    sanitize: tuple[str, frozenset[str]] | None = None
    # The sweep's source bundle (a fetched commit's kernels/src, run confined); None: the shipped one.
    source: KernelSource | None = None
    # The kernel under test (kernels/plugins): the project's own, or a plug-in's spec.
    kernel: str = "attnsweep"


def worker_name(slot: int, gpus: tuple[int, ...], environ: dict[str, str] | None = None) -> tuple[str, int | None]:
    """(result's worker name, GPU index) of worker `slot`, dealt round-robin over `gpus`."""
    if not gpus:
        return "embedded", None
    entry = slot % len(gpus)
    from kernels.devices import visible_id

    name = f"embedded-gpu{visible_id(gpus[entry], environ if environ is not None else os.environ)}"
    if len(set(gpus)) < len(gpus):  # several entries share a GPU: tell them apart
        name += f".{entry}"
    return name, gpus[entry]


# --- the worker process --------------------------------------------------------------------------
def _worker_main(conn: Connection, spec: WorkerSpec, environ: dict[str, str]) -> None:
    """Run the configs this process is sent until told to stop (None) or until it must end."""
    # Ctrl-C reaches the whole process group: the parent stores the sweep as cancelled and stops
    # this process; a traceback of its own here would only bury the parent's line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()   # the parent's environment now, not the fork server's at its start
    os.environ.update(environ)
    if spec.gpu is not None:
        pin_gpu(spec.gpu)   # before the thread below loads a runtime, which reads the pin
    from isolation.confined import backend_for

    loading: Future[Backend] = ThreadPoolExecutor(1, thread_name_prefix="backend").submit(
        backend_for, spec.backend_name, spec.defects, spec.source, kernel=spec.kernel)
    ready_at = [0.0]
    loading.add_done_callback(lambda _f: ready_at.__setitem__(0, time.time()))
    handed = []

    def backend() -> Backend:
        """The backend loading since the start; a new one after a timeout dropped it."""
        if handed:
            return backend_for(spec.backend_name, spec.defects, spec.source, kernel=spec.kernel)
        handed.append(True)
        return loading.result()

    data = DataCache.from_settings()
    executor = ConfigExecutor(spec.backend_name, spec.defects, limits=spec.limits, backend_factory=backend,
                              sanitize=spec.sanitize[0] if spec.sanitize else None,
                              sanitize_hashes=spec.sanitize[1] if spec.sanitize else frozenset(), kernel=spec.kernel,
                              data=data)
    lock = threading.Lock()
    sent: set[int] = set()

    def send(index: int, result: ConfigResult, exiting: bool) -> None:
        with lock:   # the watchdog thread and this one never both send a config's result
            if index not in sent:
                sent.add(index)
                conn.send(("result", index, result, exiting))

    while True:
        message = conn.recv()
        if message is None:
            return
        index, config_json = message
        began = time.time()
        config = parse_config(config_json)
        drawn, drawn_hit = None, None
        if not loading.done():   # numpy's generator and the driver's calls run outside the GIL
            t0 = time.perf_counter()
            inputs, drawn_hit = data.inputs(config) if data is not None else (make_inputs(config), None)
            drawn = (inputs, time.perf_counter() - t0)
        try:
            loading.result()
        except Exception as exc:  # noqa: BLE001 - a backend that cannot load fails the sweep, in the parent
            conn.send(("broken", index, f"backend {spec.backend_name}: {exc!r}", True))
            return

        def hard_timeout(result: ConfigResult, i: int = index) -> None:
            send(i, result, True)

        result = executor.run(config, gates_for(config), hard_timeout, drawn=drawn)
        drawn = None   # freed before the memory below is read
        if drawn_hit is not None:
            result.timings["inputs_cached"] = float(drawn_hit)
        # Not stored: epoch times that line up the pool's processes (bench/sweep.py shows where a
        # pool idles), and the process's memory: its peak, and what stays resident between configs.
        result.timings.update(pid=float(os.getpid()), ready_at=ready_at[0], began_at=began, **_memory_mb())
        send(index, result, result.poisons_process)
        if result.poisons_process:
            executor.fault_exit()


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
    GPU runtime: it imports numpy, the reference and the runner once, and each worker forks
    from it in milliseconds, where a spawned one spends seconds importing them again. Each takes
    the parent's environment of the moment (_worker_main's `environ`): the server keeps the one
    it started with."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["workers.embedded"])
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


# --- the pool ------------------------------------------------------------------------------------
class _Slot:
    """One worker process and the config it holds."""

    def __init__(self, ctx: mp.context.BaseContext, spec: WorkerSpec) -> None:
        self.spec = spec
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, spec, dict(os.environ)), daemon=True)
        self.proc.start()
        child.close()
        self.current: int | None = None
        self.since = 0.0

    def give(self, index: int, config: dict) -> None:
        self.current, self.since = index, time.monotonic()
        self.conn.send((index, config))

    def stop(self, kill: bool = False) -> None:
        if kill and self.proc.is_alive():
            self.proc.kill()
        elif self.proc.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(timeout=5 if not kill else 30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _results(todo: list[dict], backend_name: str, defects: frozenset[str], jobs: int,
             gpus: tuple[int, ...] = (), limits: Limits | None = None,
             sanitize: tuple[str, frozenset[str]] | None = None,
             source: KernelSource | None = None, kernel: str = "attnsweep") -> Iterator[list[tuple[ConfigResult, str]]]:
    """Batches of (result, worker name): each holds the results that were in when it was taken.
    The pool runs in a thread of its own, so its processes keep working while the caller stores."""
    if gpus and jobs < len(gpus):
        raise ValueError(f"--jobs {jobs}: needs at least one process per --gpus entry ({len(gpus)})")
    limits = limits or process_limits()
    jobs = max(1, jobs)
    if jobs > 1:
        cap_blas_threads()  # jobs processes already fill the cores
    if not todo:
        return
    todo = largest_first(todo)
    ctx = _pool_context()
    specs = [WorkerSpec(backend_name, defects, limits, *worker_name(i, gpus), sanitize, source, kernel)
             for i in range(jobs)]
    out: queue.Queue = queue.Queue()
    stop = threading.Event()
    pool = threading.Thread(target=_dispatch, args=(ctx, specs[:min(jobs, len(todo))], todo, limits, out, stop),
                            name="embedded-pool", daemon=True)
    pool.start()
    try:
        while True:
            batch = [out.get()]
            while len(batch) < STORE_BATCH_MAX and not isinstance(batch[-1], (BaseException, _End)):
                try:
                    batch.append(out.get_nowait())
                except queue.Empty:
                    break
            last = batch[-1]
            if isinstance(last, (BaseException, _End)):
                batch.pop()
            if batch:
                yield batch
            if isinstance(last, BaseException):
                raise last
            if isinstance(last, _End):
                return
    finally:
        stop.set()
        pool.join()


class _End:
    """The pool thread's last message: every config has a result."""


def _dispatch(ctx: mp.context.BaseContext, specs: list[WorkerSpec], todo: list[dict], limits: Limits,
              out: queue.Queue, stop: threading.Event) -> None:
    """Hand configs to idle worker processes, pass their results on, replace the ones that end."""
    waiting = deque(range(len(todo)))
    starts = [0] * len(todo)
    slots: list[_Slot] = []
    kill_after = limits.config_s + limits.grace_s + KILL_MARGIN_S if limits.config_s > 0 else None
    left = len(todo)
    try:
        slots = [_Slot(ctx, spec) for spec in specs]
        while left and not stop.is_set():
            for slot in slots:
                if slot.current is None and waiting and slot.proc.is_alive():
                    index = waiting.popleft()
                    starts[index] += 1
                    slot.give(index, todo[index])
            wait([s.conn for s in slots if s.current is not None] + [s.proc.sentinel for s in slots], timeout=0.5)
            for i, slot in enumerate(slots):
                replace = False
                while slot.current is not None and _poll(slot.conn):
                    try:
                        kind, _index, payload, exiting = slot.conn.recv()
                    except (EOFError, OSError):
                        break
                    if kind == "broken":
                        raise RuntimeError(payload)
                    out.put((payload, slot.spec.name))
                    slot.current = None
                    left -= 1
                    replace = replace or exiting
                if slot.current is not None and not slot.proc.is_alive():
                    index = slot.current
                    if starts[index] >= MAX_STARTS:
                        out.put((_unrun(todo[index], slot.spec, "error",
                                        f"the worker process running it died (exit code {slot.proc.exitcode}) "
                                        f"{starts[index]} times; not run again"), slot.spec.name))
                        left -= 1
                    else:   # it runs again, first, in the process that replaces this one
                        waiting.appendleft(index)
                    slot.current, replace = None, True
                elif slot.current is not None and kill_after is not None and time.monotonic() - slot.since > kill_after:
                    out.put((_unrun(todo[slot.current], slot.spec, "timeout",
                                    f"exceeded the per-config time limit of {limits.config_s:g} s; its worker process "
                                    f"did not end it within {kill_after - limits.config_s:g} s more and was killed"),
                             slot.spec.name))
                    left -= 1
                    slot.current, replace = None, True
                elif not slot.proc.is_alive():
                    replace = True
                if replace and left:
                    slot.stop(kill=True)
                    slots[i] = _Slot(ctx, slot.spec)
        out.put(_End())
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        out.put(exc)
    finally:
        for slot in slots:
            slot.stop(kill=stop.is_set() and slot.current is not None)


def _poll(conn: Connection) -> bool:
    try:
        return conn.poll()
    except (EOFError, OSError):
        return False


def _unrun(config_json: dict, spec: WorkerSpec, outcome: str, detail: str) -> ConfigResult:
    config = parse_config(config_json)
    return unrun_result(config, None, spec.backend_name, gates_for(config), outcome, detail, defects=spec.defects,
                        kernel=spec.kernel)


def execute_sweep(
    session: Session,
    sweep_id: int,
    backend_name: str,
    defects: frozenset[str] = frozenset(),
    jobs: int = 1,
    on_result: Callable[[ConfigResult], None] | None = None,
    gpus: tuple[int, ...] | list[int] = (),
    time_limit_s: float | None = None,
) -> None:
    """Run the sweep's queued configs in `jobs` worker processes and store every result, one
    commit of `session` (the caller's unit of work, store.db.unit_of_work) per batch.
    `time_limit_s`: the per-config limit (default: the ATTNSWEEP_CONFIG_TIME_LIMIT_S setting)."""
    todo = [cfg for _hash, cfg in repo.queued_configs(session, sweep_id)]
    sanitize = repo.sweep_sanitize(session, sweep_id)
    source_hash, _commit = repo.sweep_revision(session, sweep_id)
    kernel = sweep_kernel(session, sweep_id)
    # A sweep of a stored bundle (a CI sweep run again here) runs that source, confined.
    source = load_bundle(session, source_hash) if source_hash else None
    if source_hash and source is None:
        repo.set_status(session, sweep_id, "failed", error=f"source bundle {source_hash} of this sweep is not in the store")
        session.commit()
        raise LookupError(f"sweep {sweep_id}: source bundle {source_hash} is not in the store")
    repo.set_status(session, sweep_id, "running")
    session.commit()
    try:
        limits = process_limits(time_limit_s)   # a setting that does not validate fails the sweep
        for batch in _results(todo, backend_name, defects, jobs, tuple(gpus), limits, sanitize, source, kernel):
            t0 = time.perf_counter()
            repo.record_results(session, sweep_id, [(r.config_hash, r.to_row(), worker) for r, worker in batch])
            ran = next((r for r, _w in batch if r.kernel_version), None)
            if ran is not None:
                note_kernel(session, sweep_id, ran.kernel, ran.kernel_version)
            session.commit()
            # After the rows are written, so not stored; bench/sweep.py reads it through on_result.
            store_s = (time.perf_counter() - t0) / len(batch)
            for result, _worker_name in batch:
                result.timings["store_s"] = store_s
                if on_result:
                    on_result(result)
    except BaseException as exc:
        session.rollback()
        repo.set_status(session, sweep_id, "failed" if not isinstance(exc, KeyboardInterrupt) else "cancelled",
                        error=repr(exc))
        session.commit()
        raise
    repo.set_status(session, sweep_id, "done")
    session.commit()
