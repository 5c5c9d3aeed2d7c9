"""The services the tests need, PostgreSQL and Redis, and whether each answers now.

    .venv/bin/python -m tests.services     (`make test` prints this line first)

tests/conftest.py asks the same before the first test and fails each test whose service is down
with the reason, so a run without them never passes.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping

PG_ADMIN = os.environ.get("ATTNSWEEP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("ATTNSWEEP_TEST_REDIS", "redis://127.0.0.1:6379/0")
PROBE_TIMEOUT_S = 3
USED_BY = {"PostgreSQL": "tests/integration, tests/e2e and the unit tests on both databases",
           "Redis": "tests/integration"}


def _postgres_down() -> str | None:
    import psycopg

    try:
        psycopg.connect(PG_ADMIN, connect_timeout=PROBE_TIMEOUT_S).close()
    except psycopg.Error as exc:
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def _redis_down() -> str | None:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc) or type(exc).__name__
    finally:
        client.close()
    return None


WHERE = {"PostgreSQL": PG_ADMIN, "Redis": REDIS_URL}
PROBES: dict[str, Callable[[], str | None]] = {"PostgreSQL": _postgres_down, "Redis": _redis_down}


def down(names: Mapping[str, object]) -> dict[str, str]:
    """Of the services named, those that do not answer, each with why."""
    return {name: why for name in names if (why := PROBES[name]())}


def line(needed: Mapping[str, int | str], down: Mapping[str, str]) -> str:
    """One line: each needed service's place, up or down and why, and which tests need it (a
    count, or who)."""
    if not needed:
        return "services: none needed by the selected tests"
    parts = []
    for name, users in needed.items():
        users = f"{users} tests" if isinstance(users, int) else users
        state = f"DOWN ({down[name]}), so {users} fail" if name in down else f"up ({users})"
        parts.append(f"{name} at {WHERE[name]} {state}")
    return "services: " + "; ".join(parts)


if __name__ == "__main__":
    print(line(USED_BY, down(USED_BY)), flush=True)
