"""The confined process's side (`python -m isolation.kernel_main`, started by isolation.confined):
it builds the kernel under test from what its parent sends and answers prepare and run requests.

Its settings come in the first message (settings.use), never from an environment. It answers
each request with a frame of isolation.wire: what prepare chose, or what the kernel wrote, or the
typed failure (kernels.errors) by name and fields. Anything it prints goes to stderr, which the
parent keeps the end of.
"""
from __future__ import annotations

import dataclasses
import os
import resource
import sys
import time
import traceback
from typing import Any

from isolation.wire import PeerGone, receive, send

# Inputs the parent sends: the largest config's q, k, v and bias with room to spare; the parent
# bounds what it sends by the config anyway.
MAX_INPUT_BYTES = 64 << 30
LOG_CHARS = 20_000


def _failure(exc: BaseException) -> dict[str, Any]:
    from kernels.errors import (BackendUnavailable, CompileError, DeviceFault, DeviceOutOfMemory, LaunchError,
                                NotApplicable, PluginError)

    kind = type(exc).__name__
    if isinstance(exc, PluginError):
        return {"error": "PluginError", "message": str(exc)}
    if isinstance(exc, NotApplicable):
        return {"error": "NotApplicable", "reason": exc.reason, "detail": exc.detail}
    if isinstance(exc, CompileError):
        return {"error": "CompileError", "message": str(exc), "log": exc.log[-LOG_CHARS:], "timed_out": exc.timed_out}
    if isinstance(exc, DeviceFault):
        return {"error": "DeviceFault", "message": str(exc), "poisons": exc.poisons}
    if isinstance(exc, LaunchError):
        return {"error": "LaunchError", "message": str(exc), "log": exc.log[-LOG_CHARS:]}
    if isinstance(exc, DeviceOutOfMemory):
        return {"error": "DeviceOutOfMemory", "message": str(exc)}
    if isinstance(exc, MemoryError):
        return {"error": "MemoryError", "message": "".join(traceback.format_exception_only(exc)).strip()}
    if isinstance(exc, BackendUnavailable):
        return {"error": "BackendUnavailable", "message": str(exc)}
    return {"error": "Exception", "message": f"{kind}: {exc}",
            "log": "".join(traceback.format_exception(exc))[-LOG_CHARS:]}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


def serve() -> None:
    inbox, outbox = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # prints go to stderr, never into the pipe
    init, _ = receive(inbox, 0)
    import settings

    settings.use(settings.Settings(**init["settings"]))
    from attnconfig import parse_config
    from kernels import get_backend
    from kernels.backends.base import Prepared
    from kernels.source import KernelSource

    try:
        source = KernelSource.from_files(init["source_files"]) if init.get("source_files") else None
        if init.get("kernel", "attnsweep") != "attnsweep":   # a plug-in (kernels/plugins) that did not ship
            from kernels.plugins import kernel_backend

            backend = kernel_backend(init["kernel"], init["backend"])
        else:
            backend = get_backend(init["backend"], defects=frozenset(init["defects"]), source=source)
        info = backend.device_info()
    except BaseException as exc:  # noqa: BLE001 - the parent raises it again, as itself
        send(outbox, {"ok": False, **_failure(exc)})
        return
    send(outbox, {"ok": True, "device_info": dataclasses.asdict(info), "name": backend.name, "cpu_s": _cpu_s()})
    prepared: dict[str, Prepared] = {}
    while True:
        try:
            request, inputs = receive(inbox, MAX_INPUT_BYTES)
        except PeerGone:
            return
        try:
            config = parse_config(request["config"])
            key = config.content_hash()
            if request["op"] == "prepare" or key not in prepared:
                t0 = time.perf_counter()
                prepared[key] = backend.prepare(config)
                compile_s = time.perf_counter() - t0
            if request["op"] == "prepare":
                p = prepared[key]
                send(outbox, {"ok": True, "variant": p.variant, "block_n": p.block_n, "source_hash": p.source_hash,
                              "compile_s": compile_s, "cache_hit": p.cache_hit, "cpu_s": _cpu_s()})
                continue
            out = backend.run(prepared.pop(key), config, {**request.get("scalars", {}), **inputs})
            arrays = {name: getattr(out, name) for name in ("out", "lse", "o_partials", "lse_partials")
                      if getattr(out, name) is not None}
            send(outbox, {"ok": True, "run_s": out.run_s, "transfer_s": out.transfer_s, "cpu_s": _cpu_s()}, arrays)
        except Exception as exc:  # noqa: BLE001 - a config's failure, sent to be raised in the parent
            send(outbox, {"ok": False, **_failure(exc), "poisoned": bool(backend.poisoned), "cpu_s": _cpu_s()})
            if backend.poisoned:
                return


if __name__ == "__main__":
    serve()
