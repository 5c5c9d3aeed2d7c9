"""Runs in a child process, for backends whose faults outlive the run.

On a GPU an illegal address stays in the context (every later call of the process fails with
it, and a new backend in the same process gets the same context), and a hung kernel blocks in a
driver call that no signal interrupts. So on the device backends triage (triage.attempt) runs
every attempt in a child process, which this one replaces after a run that poisoned it, kills
when a run outlives its time limit by GRACE_S, and starts again after it died. What the child
runs is its caller's: `python -m MAIN` (triage's: triage.child_main, an in-process
triage.attempt.Runner), which answers with `send` and `receive`.

The child is a plain subprocess, not a multiprocessing child: a Celery prefork worker is a
daemon process, and multiprocessing forbids daemons to have children. It reads length-prefixed
pickles on stdin and answers on a duplicate of its stdout; anything it prints goes to stderr.
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from attnconfig import AttentionConfig
from kernels.backends.base import BackendUnavailable

GRACE_S = 5.0       # past the child's own time limit (SIGALRM), the run is stuck in a driver call
START_S = 180.0     # a child's start: imports, the runtime, the context
_HEADER = struct.Struct("<Q")
ROOT = Path(__file__).resolve().parents[1]


class ChildDied(RuntimeError):
    pass


def send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], wait)[0]:
            raise TimeoutError()
        chunk = os.read(fd, left)
        if not chunk:
            raise ChildDied("the child process closed its pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, deadline: float | None = None) -> Any:
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exactly(fd, size, deadline))


class ChildRunner:
    """Runs requests in a child process, `python -m main`, that gets these settings first; `name`
    says whose child it is in what a failure reports."""

    def __init__(self, settings: dict[str, Any], *, main: str, name: str):
        self.settings = settings
        self.main = main
        self.name = name
        self._proc: subprocess.Popen | None = None
        self.started = 0  # child processes started, for the record and the tests

    @property
    def time_limit_s(self) -> float | None:
        return self.settings.get("time_limit_s")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is not None:  # died between runs: not a run's fault
            self.close()
        if self._proc is None:
            # The packages beside isolation/ importable whatever the working directory.
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
            proc = subprocess.Popen([sys.executable, "-m", self.main], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path})
            self._proc, self.started = proc, self.started + 1
            try:
                send(proc.stdin.fileno(), self.settings)
                answer = receive(proc.stdout.fileno(), time.monotonic() + START_S)
            except (TimeoutError, ChildDied, BrokenPipeError) as exc:
                self.close()
                raise ChildDied(f"the {self.name} child process did not start: {exc or 'no answer'}") from None
            if answer[0] != "ready":
                self.close()
                kind, message = answer[1], answer[2]
                raise (BackendUnavailable if kind == "BackendUnavailable" else ChildDied)(message)
        return self._proc

    def call(self, op: str, config: AttentionConfig) -> tuple[str, Any]:
        """("ok", value), ("timeout", detail) or ("died", detail) of one request to the child."""
        proc = self._start()
        deadline = None if not self.time_limit_s else time.monotonic() + self.time_limit_s + GRACE_S
        try:
            send(proc.stdin.fileno(), (op, config.to_dict()))
            answer = receive(proc.stdout.fileno(), deadline)
        except TimeoutError:
            self.close()
            return "timeout", (f"exceeded the time limit of {self.time_limit_s:g} s and did not stop within "
                               f"{GRACE_S:g} s more: the {self.name} child process was killed")
        except (ChildDied, BrokenPipeError):
            code = self.close()
            return "died", f"the {self.name} child process died (exit status {code})"
        if answer[0] == "raise":
            raise RuntimeError(f"{self.name} child: {answer[1]}: {answer[2]}")
        value, poisoned = answer[1], answer[2]
        if poisoned:  # its context is unusable: the next attempt gets a new process
            self.close()
        return "ok", value

    def close(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        return proc.wait()
