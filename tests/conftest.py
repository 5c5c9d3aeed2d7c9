"""Shared fixtures: a fresh SQLite file or a fresh PostgreSQL database per test; a kernel
repository of many commits, one of which turns a defect on (tests/kernel_repo.py).

The services: before the first test, one line says which services the selected tests need
(PostgreSQL for a test that takes a database of its own, Redis for one that runs the service)
and whether each answers; a test whose service is down fails at once with that reason, so a run
without them never passes."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests import services

PG_ADMIN = services.PG_ADMIN
# The API tests' token (the API is closed by default): an admin, so every endpoint answers.
TEST_SECRET = "test-secret-" + "0123456789abcdef" * 2
TEST_TOKENS = f"tests:admin:{TEST_SECRET}"
AUTH = {"Authorization": f"Bearer {TEST_SECRET}"}
DOWN = pytest.StashKey[dict[str, str]]()   # service -> why it is down
# service -> whether a test needs it: PostgreSQL a test with a database of its own, Redis one
# that runs the service (tests/integration's `service` fixture).
NEEDS = {
    "PostgreSQL": lambda item: "pg_url" in item.fixturenames
    or getattr(getattr(item, "callspec", None), "params", {}).get("db_url") == "postgresql",
    "Redis": lambda item: "service" in item.fixturenames,
}


def pytest_configure(config: pytest.Config) -> None:
    # The workers' cache of inputs and references (sweeps/datacache.py) is off unless a test
    # names its folder: a user's setting does not reach the processes a test starts.
    os.environ.pop("ATTNSWEEP_DATA_CACHE", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The confinement's tests need bubblewrap: on the PATH, or named by ATTNSWEEP_BWRAP (a copy
    # carried to a machine that has none).
    if os.environ.get("ATTNSWEEP_BWRAP") or shutil.which("bwrap"):
        return
    for item in items:
        if "needs_bwrap" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="bubblewrap is not installed: apt-get install bubblewrap "
                                                    "(.ci/run does)"))


def pytest_collection_finish(session: pytest.Session) -> None:
    needed = {name: sum(1 for item in session.items if needs(item)) for name, needs in NEEDS.items()}
    needed = {name: count for name, count in needed.items() if count}
    down = services.down(needed)
    session.config.stash[DOWN] = down
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(services.line(needed, down), red=bool(down), bold=bool(down))


def pytest_runtest_setup(item: pytest.Item) -> None:
    down = item.config.stash.get(DOWN, {})
    for name, needs in NEEDS.items():
        if name in down and needs(item):
            pytest.fail(f"needs {name} at {services.WHERE[name]}, which is down: {down[name]}", pytrace=False)


def _admin():
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A database of its own (a Celery worker never sees a test's uncommitted transaction)."""
    from store.db import get_engine

    name = f"attnsweep_test_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:

        get_engine(url).dispose()
        get_engine.cache_clear()
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'attnsweep.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'attnsweep.db'}"
    else:
        yield request.getfixturevalue("pg_url")


@pytest.fixture(scope="session")
def kernel_repo(tmp_path_factory) -> tuple[Path, list[str]]:  # noqa: ANN001
    """(the repository's folder, its commit ids oldest first): tests/kernel_repo.py. Read only."""
    from tests.kernel_repo import build_kernel_repo

    repo = tmp_path_factory.mktemp("kernel-repo")
    return repo, build_kernel_repo(repo)


@pytest.fixture(scope="session")
def two_bug_repo(tmp_path_factory) -> tuple[Path, list[str]]:  # noqa: ANN001
    """(folder, commit ids oldest first) of tests/kernel_repo.py's build_two_bug_repo. Read only."""
    from tests.kernel_repo import build_two_bug_repo

    repo = tmp_path_factory.mktemp("two-bug-repo")
    return repo, build_two_bug_repo(repo)
