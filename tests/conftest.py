"""Shared fixtures: a fresh SQLite file or a fresh PostgreSQL database per test; a kernel
repository of many commits, one of which turns a defect on (tests/kernel_repo.py)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

PG_ADMIN = os.environ.get("ATTNSWEEP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
# The API tests' token (the API is closed by default): an admin, so every endpoint answers.
TEST_SECRET = "test-secret-" + "0123456789abcdef" * 2
TEST_TOKENS = f"tests:admin:{TEST_SECRET}"
AUTH = {"Authorization": f"Bearer {TEST_SECRET}"}


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
