"""The CLI's one error path: a usage mistake, a setting that does not validate, a database or
device that cannot be reached, an interruption, each ends in one line on stderr and an exit
status a script can branch on (EXIT_STATUS, shown by `attnsweep --help`)."""
from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Any, NoReturn

import typer
from rich.markup import escape
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # typer vendors Click
from typer.core import TyperGroup

from cli.common import console, named_database

PASS, FAILING, USAGE, INFRASTRUCTURE, INTERRUPTED = 0, 1, 2, 3, 130

EXIT_STATUS = ("Exit status: 0 pass; 1 failing configs (or a config that does not pass); 2 usage mistake "
               "(an option, a setting or a file; the line on stderr names it and the rule); 3 infrastructure "
               "(database, broker or device unavailable, or an internal error); 130 interrupted (the line "
               "says what was stored).")


def say(message: str) -> None:
    # One line whatever the terminal's width (soft_wrap), so scripts can grep it; never markup.
    console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)


def die(message: str, code: int = USAGE) -> NoReturn:
    say(message)
    sys.exit(code)


def first_line(exc: BaseException) -> str:
    """A driver error's reason without SQLAlchemy's wrapping: "(psycopg.OperationalError) ..." and
    its "Background on this error" trailer."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    if "FATAL:" in text:  # libpq's reason (no such database, bad password) without the connection preamble
        return text.split("FATAL:", 1)[1].strip().splitlines()[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return re.sub(r"^\([\w.]+\) ", "", lines[0]) if lines else type(exc).__name__


def server_answered(exc: BaseException) -> bool:
    """The database server answered and refused (no such database, bad password): the URL is
    wrong, a usage mistake; otherwise it could not be reached at all."""
    return "FATAL:" in str(getattr(exc, "orig", None) or exc)


def settings_line(exc: Any) -> str:
    """A settings ValidationError as the variables that did not validate and their rules; a value
    is never echoed (it may hold a secret)."""
    parts = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err.get("loc") else ""
        rule = re.sub(r"^Value error, ", "", err.get("msg", ""))
        rule = re.sub(rf"^{re.escape(name)}=.*?: ", "", rule)
        parts.append(f"ATTNSWEEP_{name.upper()}: {rule}" if name else rule)
    return "; ".join(parts)


def _classify(exc: BaseException) -> tuple[int, str]:
    from pydantic import ValidationError

    from kernels.backends.base import BackendUnavailable
    from store.db import ArgumentError, DBAPIError, is_unreachable

    source, url = named_database()
    if isinstance(exc, ValidationError) and exc.title == "Settings":
        return USAGE, settings_line(exc)
    if isinstance(exc, ArgumentError):  # NoSuchModuleError included: not a URL SQLAlchemy can open
        return USAGE, f"{source}: {url!r} is not a database URL: {first_line(exc)}"
    if isinstance(exc, DBAPIError) and is_unreachable(exc):
        if server_answered(exc):
            return USAGE, f"{source}: cannot open the database {url}: {first_line(exc)}"
        return INFRASTRUCTURE, f"{source}: the database {url} cannot be reached: {first_line(exc)}; try again later"
    if isinstance(exc, BackendUnavailable):
        return INFRASTRUCTURE, f"device unavailable: {exc}"
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)) and exc.filename:
        return USAGE, f"{exc.filename}: {exc.strerror}"
    return INFRASTRUCTURE, (f"internal error: {type(exc).__name__}: {first_line(exc)} "
                            "(ATTNSWEEP_TRACEBACK=1 prints the traceback)")


class OneLineErrors(TyperGroup):
    """The root group: runs the command in Click's non-standalone mode, so every exception
    reaches one place and ends as one line (typer would draw boxed panels and tracebacks)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # A command that stores something on the way (run) says what itself; here nothing was.
            die("interrupted", INTERRUPTED)

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
        except NoArgsIsHelpError:
            rv = USAGE  # typer printed the help while raising it
        except UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "attnsweep"
            say(f"{exc.format_message().rstrip('.')} (see {command} --help)")
            rv = exc.exit_code
        except ClickException as exc:
            say(exc.format_message())
            rv = exc.exit_code
        except typer.Abort:
            say("interrupted")
            rv = INTERRUPTED
        except Exception as exc:  # noqa: BLE001 - the one place every other error is turned into a line
            if os.environ.get("ATTNSWEEP_TRACEBACK") == "1":
                traceback.print_exc()
            rv, line = _classify(exc)
            say(line)
        code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)
