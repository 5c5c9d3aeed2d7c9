"""Start a worker: pin its GPU, probe and register its device, consume one queue.

One worker per GPU with concurrency 1 (MITuna's layout): `--gpu N` sets CUDA_VISIBLE_DEVICES
and HIP_VISIBLE_DEVICES before anything loads a GPU runtime, so the task's backend sees only
that device. The cpu queue has its own workers (the `cpu` backend), which may run several
processes.
"""
from __future__ import annotations

import logging
import socket

from celery.signals import worker_ready, worker_shutdown

from settings import Settings
from settings.secrets import install_log_scrubbing
from kernels.devices import pin_gpu
from workers.app import create_celery
from workers.lease import LeaseRenewer
from workers.outbox import ReconcilerThread
from workers.registry import Heartbeat, probe_device, registration

log = logging.getLogger(__name__)


class WorkerStartError(RuntimeError):
    """The worker cannot serve its queue here (no GPU for the gpu queue, say)."""


def worker_argv(queue: str, concurrency: int, name: str, loglevel: str) -> list[str]:
    return [
        "worker", "--queues", queue, "--concurrency", str(concurrency), "--hostname", name,
        "--loglevel", loglevel, "--pool", "prefork", "--task-events", "--without-mingle", "--without-gossip",
    ]


def start_worker(settings: Settings, kind: str, *, gpu: int | None = None, concurrency: int = 1,
                 name: str | None = None, loglevel: str = "INFO") -> None:
    """Run a worker of the cpu or gpu queue in this process until it is stopped."""
    queue = settings.queue_name(kind)
    # Git's errors quote the URLs it fetched; a log line never shows a URL's credentials or a secret.
    install_log_scrubbing(settings.scrub)
    pin_gpu(gpu)
    backend = "cpu" if kind == "cpu" else "auto"
    info = probe_device(backend, in_subprocess=kind == "gpu")
    if kind == "gpu" and info["backend"] == "cpu":
        raise WorkerStartError("the gpu queue needs a usable CUDA or ROCm GPU and none was found"
                               + (f" (--gpu {gpu})" if gpu is not None else "")
                               + "; run a cpu worker (--queue cpu) for the cpu backend")
    name = name or f"{kind}{gpu if gpu is not None else ''}@{socket.gethostname()}"
    heartbeat = Heartbeat(settings, registration(name, queue, gpu, concurrency, info))
    app = create_celery(settings)
    # In the main process only (pool children run tasks): the leases of the tasks it holds, and
    # the reconciler of the outbox (one at a time across workers: workers.outbox).
    lease = LeaseRenewer(settings)
    reconciler = ReconcilerThread(settings, app)

    def on_ready(sender=None, **_kwargs) -> None:  # noqa: ANN001
        lease.start()
        reconciler.start()
        heartbeat.start()

    def on_shutdown(sender=None, **_kwargs) -> None:  # noqa: ANN001
        reconciler.stop()
        lease.stop()
        heartbeat.stop()

    worker_ready.connect(on_ready, weak=False)
    worker_shutdown.connect(on_shutdown, weak=False)
    log.info("worker %s: queue %s, %s on %s", name, queue, info["backend"], info["device"])
    app.worker_main(worker_argv(queue, concurrency, name, loglevel))
