"""A process of the stack (the API, a worker) started in a session of its own, so that it and
its children are signalled by PID and process group, with its output appended to a log file."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    logfile: Path
    cwd: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    log_from: int = 0   # where this start's output begins in the log

    def start(self) -> "Proc":
        self.log_from = self.logfile.stat().st_size if self.logfile.exists() else 0
        with self.logfile.open("a") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """What this start wrote to the log so far."""
        text = self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
        return text[self.log_from:]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def children(self) -> list[int]:
        """PIDs whose parent is this process (a worker's pool children)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid:
                pids.append(int(stat.parent.name))
        return pids

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def freeze(self) -> None:
        """SIGSTOP to the whole process group (the main process and its children)."""
        self.signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal_group(signal.SIGCONT)

    def kill_main(self) -> None:
        """SIGKILL to the main process alone: its children are orphaned, as after an OOM kill."""
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 20, group: bool = False) -> None:
        """SIGTERM to the main process (a warm shutdown: a Celery worker finishes its tasks), or to
        the whole process group with `group`; SIGKILL to the group after `grace_s`."""
        if not self.alive():
            return
        self.signal_group(signal.SIGCONT)   # a frozen process cannot shut down
        if group:
            self.signal_group(signal.SIGTERM)
        else:
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(timeout=10)
