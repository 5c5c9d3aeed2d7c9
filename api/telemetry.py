"""Prometheus metrics of one API instance: request counts and latencies, plus store and broker gauges.

Each app has its own registry (several apps in one process, as in tests, never clash). The
gauges are read when scraped: from the database, sweeps by status, configs waiting for a worker
in live (queued or running) sweeps, configs committed but not yet published, stuck sweeps,
seconds since a waiting config last saw a result stored (a stall), live workers per queue; from
the broker (Redis, with a 1 s timeout), whether it answers, tasks waiting per queue and tasks
delivered but not yet acknowledged per queue. Every per-queue series is written for each of the
deployment's queues, 0 included, so an alert on `== 0` fires when the last worker is gone.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from store import queries, repo

# Seconds a config takes end to end (compile, inputs, run, reference, verify: config_runs.total_s).
# Cached compiles and small configs take milliseconds; a cold compile or a large reference, minutes.
RUN_TIME_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# An active sweep that has neither stored a result nor published a config for this long, or
# whose configs have waited this long to be published, is stuck: nothing is in flight for it.
STUCK_AFTER_S = 900.0


class StoreCollector(Collector):
    def __init__(self, sessions: Callable[[], Any], stale_after_s: float, settings: Any = None):
        self.sessions = sessions
        self.stale_after_s = stale_after_s
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from store.outbox import queued_live_count, stalled_seconds, stuck_sweeps, unpublished_count

        with self.sessions() as session:
            sweeps = GaugeMetricFamily("attnsweep_sweeps", "Sweeps by status", labels=["status"])
            for status, n in sorted(queries.count_by_status(session).items()):
                sweeps.add_metric([status], n)
            queued = GaugeMetricFamily("attnsweep_configs_queued", "Configs waiting for a worker, of queued or running sweeps")
            queued.add_metric([], queued_live_count(session))
            unpublished = GaugeMetricFamily("attnsweep_configs_unpublished",
                                            "Configs committed but not yet on the broker (the reconciler publishes them)")
            unpublished.add_metric([], unpublished_count(session))
            stuck = GaugeMetricFamily("attnsweep_sweeps_stuck", f"Queued or running sweeps with nothing stored or "
                                      f"published for {STUCK_AFTER_S:g} s, or complete but not ended")
            stuck.add_metric([], len(stuck_sweeps(session, STUCK_AFTER_S)))
            stalled = GaugeMetricFamily("attnsweep_stalled_seconds", "Seconds since a result was last stored while "
                                        "configs wait (0 when none waits); longer than the slowest config means a stall")
            stalled.add_metric([], stalled_seconds(session))
            workers = GaugeMetricFamily("attnsweep_workers_alive", "Live workers by queue", labels=["queue"])
            per_queue = dict.fromkeys(self.queues(), 0)
            for w in repo.live_workers(session, self.stale_after_s):
                per_queue[w.queue] = per_queue.get(w.queue, 0) + 1
            for queue, n in sorted(per_queue.items()):
                workers.add_metric([queue], n)
            configs = GaugeMetricFamily("attnsweep_configs", "Finished configs in the store by outcome, backend and dtype",
                                        labels=["outcome", "backend", "dtype"])
            for (outcome, backend, dtype), n in sorted(queries.outcome_backend_dtype_counts(session).items()):
                configs.add_metric([outcome, backend, dtype], n)
            run_time = HistogramMetricFamily("attnsweep_config_run_seconds", "Seconds per finished config, end to end "
                                             "(compile, inputs, kernel, reference, verify), by backend", labels=["backend"])
            for backend, (buckets, total) in sorted(queries.run_time_histogram(session, RUN_TIME_BUCKETS).items()):
                run_time.add_metric([backend], [(f"{b:g}" if b != float("inf") else "+Inf", n) for b, n in buckets], total)
        yield from (sweeps, queued, unpublished, stuck, stalled, workers, configs, run_time)
        yield from self._broker()

    def queues(self) -> list[str]:
        """The deployment's queues (settings.queue_name of each kind)."""
        return [self.settings.queue_name(kind) for kind in ("cpu", "gpu")] if self.settings is not None else []

    def _broker(self) -> Iterator[GaugeMetricFamily]:
        from workers.app import redis_client
        from workers.outbox import broker_view

        if self.settings is None or redis_client(self.settings, 1.0) is None:
            return
        view = broker_view(self.settings, timeout=1.0)
        up = GaugeMetricFamily("attnsweep_broker_up", "1 when the broker (Redis) answers within 1 s")
        up.add_metric([], 1 if view.reachable else 0)
        yield up
        if not view.reachable:
            return
        depth = GaugeMetricFamily("attnsweep_queue_depth", "Tasks waiting on the broker per queue", labels=["queue"])
        unacked = GaugeMetricFamily("attnsweep_tasks_unacked", "Tasks delivered to a worker and not yet acknowledged "
                                    "(running, reserved or held for a retry) per queue", labels=["queue"])
        for queue in sorted(view.depth):
            depth.add_metric([queue], view.depth[queue])
            unacked.add_metric([queue], view.unacked.get(queue, 0))
        yield depth
        yield unacked


class Telemetry:
    def __init__(self, sessions: Callable[[], Any], stale_after_s: float, settings: Any = None):
        self.registry = CollectorRegistry()
        self.requests = Counter("attnsweep_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("attnsweep_http_request_duration_seconds", "HTTP request latency", ["method", "route"],
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.sweeps_submitted = Counter("attnsweep_sweeps_submitted", "Sweeps accepted by POST /sweeps or rerun", registry=self.registry)
        self.configs_enqueued = Counter("attnsweep_configs_enqueued", "Configs published to the queues", registry=self.registry)
        self.registry.register(StoreCollector(sessions, stale_after_s, settings))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.latency.labels(method, route).observe(seconds)
        self.requests.labels(method, route, str(status)).inc()


class TelemetryMiddleware:
    """ASGI middleware: each request's latency and status by method and route template.

    Plain ASGI rather than Starlette's BaseHTTPMiddleware, which runs every request through a
    task group and a streamed copy of the response: under 20 concurrent clients that wrapper
    was the largest share of the API process's CPU time (bench/api_load.py)."""

    def __init__(self, app: Any, telemetry: Telemetry):
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.telemetry.observe(scope["method"], route, status, time.perf_counter() - t0)
