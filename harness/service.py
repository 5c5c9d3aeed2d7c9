"""The service as processes: `attnsweep serve` and `attnsweep worker` (python -m cli) with the
settings of a given database, broker and queue prefix, started, waited for and stopped by PID.

`service_env` is the environment every such process gets: the caller's environment without any
ATTNSWEEP_ variable, then the stack's own. One BLAS thread each: the machines that run this have
few cores, and workers run several processes beside the API.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.net import free_port, http_json, wait_for
from harness.procs import Proc

ROOT = Path(__file__).resolve().parents[1]


def service_env(database_url: str, broker_url: str, queue_prefix: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSWEEP_")}
    env.update(ATTNSWEEP_DATABASE_URL=database_url, ATTNSWEEP_BROKER_URL=broker_url, ATTNSWEEP_QUEUE_PREFIX=queue_prefix,
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


@dataclass
class ServiceStack:
    """The API and workers of one deployment, their logs in `logs`. `env` is service_env's."""

    env: dict[str, str]
    logs: Path
    root: Path = ROOT   # the tree whose `python -m cli` runs (a baseline revision's, to compare)
    headers: dict[str, str] = field(default_factory=dict)   # sent with every request (a bearer token)
    api: Proc | None = None
    api_port: int = field(default_factory=free_port)
    workers: dict[str, Proc] = field(default_factory=dict)

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return {**self.env, "PYTHONPATH": str(self.root), **extra}

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cli", *args]

    def start_api(self, timeout: float = 60, **env: str) -> Proc:
        """`attnsweep serve` on api_port, returned once /healthz answers (200, or 503 while a
        dependency is down)."""
        self.api = Proc("api", self.cli("serve", "--port", str(self.api_port)), self._env(env),
                        self.logs / "api.log", cwd=self.root).start()

        def answers() -> bool:
            if not self.api.alive():
                raise RuntimeError(f"the API exited with {self.api.proc.returncode}:\n{self.api.tail()}")
            return self.get("/healthz")[0] in (200, 503)

        wait_for(answers, timeout, "the API to answer", ignore=(OSError,))
        return self.api

    def start_worker(self, name: str, queue: str = "cpu", concurrency: int | None = None, wait: bool = True,
                     ready: Callable[[Proc], bool] | None = None, timeout: float = 90, **env: str) -> Proc:
        """`attnsweep worker --queue QUEUE --name NAME@host`; with `wait`, returned once `ready`
        says so (default: Celery's "ready." line in this start's log). A worker of the same name
        is replaced (restarted as a supervisor would)."""
        node = name if "@" in name else f"{name}@{socket.gethostname()}"
        argv = self.cli("worker", "--queue", queue, "--name", node)
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        slug = node.replace("@", "-")
        worker = Proc(node, argv, self._env(env), self.logs / f"worker-{slug}.log", cwd=self.root).start()
        self.workers[node] = worker
        if wait:
            self.wait_ready(worker, ready, timeout)
        return worker

    def wait_ready(self, worker: Proc, ready: Callable[[Proc], bool] | None = None, timeout: float = 90) -> None:
        def up() -> bool:
            if not worker.alive():
                raise RuntimeError(f"worker {worker.name} exited with {worker.proc.returncode}:\n{worker.tail()}")
            return ready(worker) if ready is not None else "ready." in worker.log()

        wait_for(up, timeout, f"worker {worker.name} to be ready")

    def stop(self) -> None:
        """Every worker, then the API: a warm shutdown each, killed if it lingers."""
        for worker in self.workers.values():
            worker.stop()
        if self.api is not None:
            self.api.stop()

    # HTTP to the API
    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.api_port}{path}"

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout: float = 30, raw_body: bytes | None = None) -> tuple[int, Any]:
        return http_json(method, self.url(path), body, {**self.headers, **(headers or {})}, timeout, raw_body)

    def get(self, path: str, timeout: float = 10, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return self.request("GET", path, timeout=timeout, headers=headers)
