"""Progress of a sweep as configs finish, counting outcomes.

On a terminal: a live bar. Anywhere else (a CI log, a pipe, a file) a bar's redraws would be
control characters and carriage returns, so it writes a plain line at most every
ATTNSWEEP_PROGRESS_INTERVAL_S seconds (settings.progress_interval_s, default 10) and one when
the last config finishes.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

def interval_s() -> float:
    from settings import get_settings

    return get_settings().progress_interval_s


def _counts(counts: Counter[str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def progress_line(what: str, done: int, total: int, elapsed_s: float, counts: Counter[str]) -> str:
    pct = 100.0 * done / total if total else 100.0
    eta = f", about {elapsed_s / done * (total - done):.0f} s left" if 0 < done < total else ""
    return f"{what} {done}/{total} ({pct:.0f}%) in {elapsed_s:.0f} s{eta}" + (f": {_counts(counts)}" if counts else "")


@contextmanager
def progress_bar(console: Console, total: int, what: str) -> Iterator[Callable[[str], None]]:
    counts: Counter[str] = Counter()
    if not console.is_terminal:
        yield from _plain_lines(console, total, what, counts)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[counts]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(what, total=total, counts="")

        def advance(outcome: str) -> None:
            counts[outcome] += 1
            progress.update(task, advance=1, counts=_counts(counts))

        yield advance


def _plain_lines(console: Console, total: int, what: str, counts: Counter[str]) -> Iterator[Callable[[str], None]]:
    every = interval_s()
    t0 = time.monotonic()
    last = [t0]

    def emit(now: float) -> None:
        console.print(progress_line(what, sum(counts.values()), total, now - t0, counts), highlight=False,
                      soft_wrap=True, markup=False)
        last[0] = now

    def advance(outcome: str) -> None:
        counts[outcome] += 1
        now = time.monotonic()
        if sum(counts.values()) >= total or now - last[0] >= every:
            emit(now)

    yield advance
    if sum(counts.values()) < total:  # stopped early (interrupted): say where it stopped
        emit(time.monotonic())
