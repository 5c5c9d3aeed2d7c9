"""Prometheus metrics of one API instance: request counts and latencies, plus store gauges.

Each app has its own registry (several apps in one process, as in tests, never clash). The
gauges are read from the database when scraped: sweeps by status, configs waiting in the
queue, live workers per queue.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from store import queries, repo


class StoreCollector(Collector):
    def __init__(self, sessions: Callable[[], Any], stale_after_s: float):
        self.sessions = sessions
        self.stale_after_s = stale_after_s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.sessions() as session:
            sweeps = GaugeMetricFamily("attnsweep_sweeps", "Sweeps by status", labels=["status"])
            for status, n in sorted(queries.count_by_status(session).items()):
                sweeps.add_metric([status], n)
            queued = GaugeMetricFamily("attnsweep_configs_queued", "Configs waiting for a worker")
            queued.add_metric([], queries.queued_config_count(session))
            workers = GaugeMetricFamily("attnsweep_workers_alive", "Live workers by queue", labels=["queue"])
            per_queue: dict[str, int] = {}
            for w in repo.live_workers(session, self.stale_after_s):
                per_queue[w.queue] = per_queue.get(w.queue, 0) + 1
            for queue, n in sorted(per_queue.items()):
                workers.add_metric([queue], n)
        yield from (sweeps, queued, workers)


class Telemetry:
    def __init__(self, sessions: Callable[[], Any], stale_after_s: float):
        self.registry = CollectorRegistry()
        self.requests = Counter("attnsweep_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("attnsweep_http_request_duration_seconds", "HTTP request latency", ["method", "route"],
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.sweeps_submitted = Counter("attnsweep_sweeps_submitted", "Sweeps accepted by POST /sweeps or rerun", registry=self.registry)
        self.configs_enqueued = Counter("attnsweep_configs_enqueued", "Configs published to the queues", registry=self.registry)
        self.registry.register(StoreCollector(sessions, stale_after_s))

    async def middleware(self, request: Any, call_next: Callable) -> Any:
        t0 = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        self.latency.labels(request.method, route).observe(time.perf_counter() - t0)
        self.requests.labels(request.method, route, str(response.status_code)).inc()
        return response
