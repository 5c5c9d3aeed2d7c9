"""The child process of triage's runs on the device backends (isolation.child): settings first, then one (op, config) request
after another, each answered with the in-process Runner's result and whether its backend can
take the next run."""
from __future__ import annotations

import os
import sys

from attnconfig import parse_config
from kernels.source import KernelSource
from triage.attempt import Runner
from isolation.child import ChildDied, receive, send


def serve() -> None:
    """The child's side: settings first, then (op, config) requests until stdin closes."""
    inbox, outbox = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints go to stderr, not into the pipe
    settings = receive(inbox)
    files = settings.get("source_files")
    runner = Runner(settings["backend"], frozenset(settings["defects"]),
                    KernelSource.from_files(files) if files else None, err_ratio_gate=settings.get("err_ratio_gate"),
                    time_limit_s=settings.get("time_limit_s"), isolate=False, kernel=settings.get("kernel", "attnsweep"))
    try:
        runner.backend()
    except Exception as exc:  # noqa: BLE001 (the parent raises it again)
        send(outbox, ("failed", type(exc).__name__, str(exc)))
        return
    send(outbox, ("ready",))
    while True:
        try:
            op, config = receive(inbox)
        except ChildDied:
            return
        try:
            c = parse_config(config)
            value = runner.run(c) if op == "run" else runner.compiles(c)
        except Exception as exc:  # noqa: BLE001
            send(outbox, ("raise", type(exc).__name__, str(exc)))
            continue
        poisoned = not runner.holds_usable_backend
        send(outbox, ("ok", value, poisoned))


if __name__ == "__main__":
    serve()
