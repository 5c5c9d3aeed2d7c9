"""What every command of the CLI shares: its error line, the database it names, option text
read from @files."""
from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console

console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    # One line whatever the terminal's width (soft_wrap), so scripts can grep it; no traceback.
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def database_url(db: Optional[str]) -> str:
    from settings import get_settings

    if db is None:
        url = get_settings().database_url
    elif "://" in db:
        url = db
    else:
        url = f"sqlite:///{db}"
    _check_sqlite_folder(url, db_source(db))
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
    if not url.startswith("sqlite") or ":memory:" in url:
        return
    path = url.split(":///", 1)[-1].split("?", 1)[0]
    if path and not Path(path).resolve().parent.is_dir():
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
