"""A progress bar that also counts outcomes as configs finish."""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@contextmanager
def progress_bar(console: Console, total: int, what: str) -> Iterator[Callable[[str], None]]:
    counts: Counter[str] = Counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[counts]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(what, total=total, counts="")

        def advance(outcome: str) -> None:
            counts[outcome] += 1
            shown = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            progress.update(task, advance=1, counts=shown)

        yield advance
