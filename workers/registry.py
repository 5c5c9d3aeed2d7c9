"""A worker's entry in the `workers` table: its device, memory and versions, and its heartbeat.

Registration and heartbeats run in the worker's main process, which never runs a task (tasks
run in the pool's child process). The main process therefore never initialises a GPU runtime:
the device is probed in a short subprocess for GPU workers (a CUDA context does not survive
fork), and its database connections come from an engine without a pool, so the forked child
inherits no open connection.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import socket
import subprocess
import sys
from dataclasses import asdict
from importlib import metadata
from typing import Any, Sequence

from settings import Settings
from store import repo
from store.db import unpooled_session
from workers.periodic import PeriodicThread

log = logging.getLogger(__name__)


def probe_device(backend: str, in_subprocess: bool) -> dict[str, Any]:
    """The DeviceInfo of `backend` on this host, as a dict."""
    if in_subprocess:
        proc = subprocess.run([sys.executable, "-m", "workers.registry", backend], capture_output=True, text=True,
                              timeout=300, env=os.environ.copy())
        if proc.returncode != 0:
            raise RuntimeError(f"probing backend {backend} failed:\n{proc.stderr.strip()}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    from kernels import get_backend

    be = get_backend(backend)
    try:
        return asdict(be.device_info())
    finally:
        be.close()


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("attnsweep", "celery", "numpy", "sqlalchemy", "cuda-python", "hip-python"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def registration(name: str, queue: str, gpu: int | None, concurrency: int, info: dict[str, Any]) -> dict[str, Any]:
    """The columns of a worker's row (store.models.Worker)."""
    return {
        "name": name, "queue": queue, "backend": info["backend"], "gpu": gpu, "concurrency": concurrency,
        "device": info.get("device"), "total_memory": info.get("total_memory"),
        "driver_version": info.get("driver_version") or None, "compiler_version": info.get("compiler_version") or None,
        "arch": info.get("arch") or None, "versions": versions(), "hostname": socket.gethostname(), "pid": os.getpid(),
    }


class Heartbeat(PeriodicThread):
    """Registers the worker, then refreshes last_heartbeat every `heartbeat_s` until stopped; a
    database hiccup must not end the worker: the next beat retries."""

    def __init__(self, settings: Settings, row: dict[str, Any]):
        self.settings = settings
        self.row = dict(row)
        super().__init__("attnsweep-heartbeat", settings.heartbeat_s, self.beat, what=f"heartbeat of {row['name']}")

    def beat(self) -> None:
        with unpooled_session(self.settings.database_url) as s:
            repo.heartbeat(s, self.row["name"])

    def start(self) -> None:
        row = dict(self.row)
        name = row.pop("name")
        with unpooled_session(self.settings.database_url) as s:
            repo.register_worker(s, name, **row)
        log.info("registered worker %s on queue %s (%s, %s)", name, row["queue"], row["backend"], row["device"])
        super().start()

    def stop(self, join_s: float = 5.0) -> None:
        super().stop(join_s)
        with unpooled_session(self.settings.database_url) as s:
            repo.heartbeat(s, self.row["name"], stopped=True)


def record_unfinished(settings: Settings, sweep_id: int, items: Sequence[Sequence[Any]], detail: str,
                      celery: Any = None) -> int:
    """Record `timeout` for the configs of a killed batch that are still queued; returns how many.
    Ending the sweep publishes its triage task with `celery` (workers.triage.sweep_ended)."""
    with unpooled_session(settings.database_url) as s:
        pending = repo.pending_hashes(s, sweep_id, [h for h, _ in items])
        for h in pending:
            repo.record_result(s, sweep_id, h, {"outcome": "timeout", "detail": detail})
    with unpooled_session(settings.database_url) as s:
        ended = repo.finish_if_complete(s, sweep_id)
    if ended:
        from workers.triage import sweep_ended

        sweep_ended(settings, sweep_id, celery)
    return len(pending)


if __name__ == "__main__":  # `python -m workers.registry BACKEND`: the probe of probe_device
    print(json.dumps(probe_device(sys.argv[1], in_subprocess=False)))
