"""Engines and sessions from a database URL; the schema itself belongs to the migrations."""
from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from functools import lru_cache
from typing import ContextManager, Iterator

from sqlalchemy import create_engine, event, exc as sa_exc, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

# What the layers above name without SQLAlchemy of their own: `Session` (the argument of every
# store function), the error of a write that broke a unique or foreign key (a racing duplicate),
# and any database error.
IntegrityError = sa_exc.IntegrityError
DatabaseError = sa_exc.SQLAlchemyError
DBAPIError = sa_exc.DBAPIError        # the driver's own error (connection refused, no such database)
ArgumentError = sa_exc.ArgumentError  # not a URL SQLAlchemy can open (NoSuchModuleError included)


def redacted_url(url: str) -> str:
    """The URL with its password hidden; an unparsable one as given."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - shown as given
        return url


def url_backend(url: str) -> str | None:
    """The database kind a URL names (`sqlite`, `postgresql`), None where it is no database URL."""
    try:
        return make_url(url).get_backend_name()
    except ArgumentError:
        return None

def connect_timeout_s() -> int:
    """Seconds a new PostgreSQL connection may take (settings.db_connect_timeout_s): with the
    server down or unreachable, a request or a task fails within this and is answered 503 or
    retried, instead of waiting for the kernel's TCP timeout. The process's settings, not a
    caller's Settings object: engines are shared per URL."""
    from settings import get_settings

    return get_settings().db_connect_timeout_s


def is_unreachable(error: BaseException) -> bool:
    """The database could not be reached or dropped the connection (server down, restarting,
    refusing connections, the pool exhausted): worth retrying later, not a bad request or a bug.
    SQLAlchemy wraps these driver errors as OperationalError or InterfaceError, or flags the
    connection invalidated."""
    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return True
    return isinstance(error, sa_exc.DBAPIError) and bool(error.connection_invalidated)


def ping(session: Session) -> None:
    """One round trip to the database; raises DatabaseError when it does not answer."""
    session.execute(text("SELECT 1"))


def check_writable(session: Session) -> None:
    """Raise when the database answers but cannot write. PostgreSQL with a full disk still
    answers queries and refuses only what needs new space: this creates a temporary table and
    writes a page of it, which extends a file on the database's disk, then rolls it back."""
    if session.get_bind().dialect.name != "postgresql":
        return
    try:
        session.execute(text("CREATE TEMP TABLE attnsweep_write_probe (b bytea) ON COMMIT DROP"))
        session.execute(text("INSERT INTO attnsweep_write_probe VALUES ('x')"))
    finally:
        session.rollback()


def commit_without_flush_wait(session: Session) -> None:
    """Commit, on PostgreSQL without waiting for the WAL to reach the disk (synchronous_commit
    off for this transaction): for writes that a crash may lose because someone redoes them."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL synchronous_commit = off"))
    session.commit()


def normalize_url(url: str) -> str:
    """Accept plain postgresql:// (and postgres://) URLs and drive them through psycopg 3."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain):]
    return url


# Every engine get_engine made in this process, for _forget_inherited_pools.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_inherited_pools() -> None:
    """In a child just forked (a Celery pool process, the embedded pool's): drop the pooled
    connections it inherited without closing them.

    Each is its parent's session on the same socket. A child that used one would interleave its
    statements with the parent's on one server session: replies read by the wrong process,
    psycopg's prepared statements ("_pg3_0") created twice, a transaction left open under the
    other. In a Celery worker the main process's reconciler holds such a connection, and the
    pool forks a replacement child whenever one dies. dispose(close=False) gives the child empty
    pools of its own; the parent's sockets stay open for the parent (psycopg closes a connection
    only in the process that opened it)."""
    for engine in list(_ENGINES):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited_pools)


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    engine = _new_engine(normalize_url(url))
    _ENGINES.add(engine)
    return engine


def _new_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # noqa: ANN001
            # WAL lets readers (the CLI summary, the API) run beside the single writer.
            # synchronous=NORMAL: WAL then syncs at checkpoints, not at every commit (a sweep
            # commits once per config: 10 ms each on FULL). A crashed process loses nothing;
            # a power cut can lose the last commits, whose configs stay queued and run again.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # Keepalives find a peer that vanished without closing (a host down, a cable cut) in about
    # 20 s instead of the kernel's two hours; pool_timeout bounds the wait for a pooled connection.
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, pool_timeout=10,
                         connect_args={"connect_timeout": connect_timeout_s(), "keepalives": 1, "keepalives_idle": 10,
                                       "keepalives_interval": 5, "keepalives_count": 2})


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str, *, expire_on_commit: bool = False) -> Iterator[Session]:
    """A transaction: commit on success, roll back on any exception, then close."""
    session = session_factory(url)(expire_on_commit=expire_on_commit)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def unit_of_work(url: str) -> ContextManager[Session]:
    """One session for a run of several steps (`attnsweep run`: plan, execute, triage, report;
    a triage task), opened once and passed down. Each step commits what it wrote where its
    transaction ends (`session.commit()`), and rolls back before it goes on after an error; a
    commit expires what the session holds, so the next step reads the rows as they are now
    (another process, or a bulk UPDATE, may have changed them). What is left is committed at the
    end, or rolled back on an exception."""
    return session_scope(url, expire_on_commit=True)


@contextmanager
def unpooled_session(url: str) -> Iterator[Session]:
    """A transaction on a connection of its own, closed afterwards: safe across fork, where a
    pooled connection inherited by a child would be shared by two processes."""
    engine = create_engine(normalize_url(url), poolclass=NullPool)
    try:
        with Session(engine) as session, session.begin():
            yield session
    finally:
        engine.dispose()
