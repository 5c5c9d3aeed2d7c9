"""What every command of the CLI shares: its error line, the database it names (and whether a
read may open it), option text read from @files."""
from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)
# The database the command resolved (source, URL), for the line of an error raised after it.
_named: list[tuple[str, str]] = []
SCHEMES = ("sqlite", "postgresql")


def fail(message: str, code: int = 2) -> NoReturn:
    # One line whatever the terminal's width (soft_wrap), so scripts can grep it; no traceback,
    # and the message is text, never markup (a config hash in brackets stays).
    console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def named_database() -> tuple[str, str]:
    """(source, URL) of the database the command named, redacted; ("database", "") before any."""
    return _named[-1] if _named else ("database", "")


def redacted(url: str) -> str:
    from store.db import redacted_url

    return redacted_url(url)


def database_url(db: Optional[str]) -> str:
    from settings import get_settings

    if db is None:
        url = get_settings().database_url
    elif "://" in db:
        url = db
    else:
        url = f"sqlite:///{db}"
    source = db_source(db)
    _named.append((source, redacted(url)))
    _check_scheme(url, source)
    _check_sqlite_folder(url, source)
    return url


def _check_scheme(url: str, source: str) -> None:
    from store.db import url_backend

    if url_backend(url) not in SCHEMES:
        fail(f"{source} {redacted(url)!r}: must be a SQLite file path, a sqlite:/// URL or a postgresql:// URL")


def sqlite_path(url: str) -> Optional[Path]:
    """The file of a SQLite URL; None for PostgreSQL and SQLite in memory."""
    if not url.startswith("sqlite") or ":memory:" in url:
        return None
    path = url.split(":///", 1)[-1].split("?", 1)[0]
    return Path(path) if path else None


def existing_database(db: Optional[str]) -> str:
    """The URL of a database a read command may open: it exists and is at the newest schema. A
    read never creates a SQLite file nor migrates a schema, so a wrong --db or folder leaves
    nothing behind; what is missing is one line (exit 2)."""
    from store.migrate import is_current

    url = database_url(db)
    source = db_source(db)
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        fail(f"{source}: no database at {str(path)!r} (run `attnsweep run` first)")
    if not is_current(url):
        fail(f"{source}: the database {redacted(url)} is not at the newest schema revision "
             f"(`attnsweep db upgrade{'' if db is None else ' --db ' + db}` migrates it)")
    return url


def db_source(db: Optional[str]) -> str:
    """Which setting named the database, for error messages."""
    from settings import get_settings

    if db is not None:
        return "--db"
    named = "database_url" in get_settings().model_fields_set
    return "ATTNSWEEP_DATABASE_URL" if named else "the default database (--db to name one)"


def _check_sqlite_folder(url: str, source: str) -> None:
    # SQLite creates the file but not its folder; its own message ("unable to open database
    # file") names neither, so say which folder is missing before anything is started.
    path = sqlite_path(url)
    if path is not None and not path.resolve().parent.is_dir():
        fail(f"{source}: the folder {str(Path(path).parent)!r} of the SQLite file does not exist (create it first)")


def option_text(value: str, option: str) -> str:
    """An option's text, or the file it names as @PATH; a file that cannot be read is a usage
    error naming the option."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text()
    except OSError as exc:
        fail(f"{option} {value}: cannot read the file: {exc.strerror or exc}")
