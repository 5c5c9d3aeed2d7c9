"""Services started for tests, drills and benchmarks: free loopback ports, waiting until a
dependency answers, PostgreSQL, Redis, the API and Celery workers as processes started, frozen,
killed and stopped by their PID, each with its own log.

Used by drills/, bench/service.py, tests/integration, tests/e2e and deploy/smoke/. Only the
standard library at import time (the compose smoke runs on the host's python3, outside the
project's venv); redis and psycopg are imported where a check needs them. It imports no package of
the product and the product imports none of it (pyproject.toml [tool.importlinter]).
"""
from harness.net import free_port, http_json, wait_for
from harness.postgres_cluster import PostgresCluster
from harness.procs import Proc
from harness.redis_server import RedisServer
from harness.service import ServiceStack, service_env

__all__ = ["PostgresCluster", "Proc", "RedisServer", "ServiceStack", "free_port", "http_json", "service_env", "wait_for"]
