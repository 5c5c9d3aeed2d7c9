"""A kernel that did not ship, run in a confined process: the Backend the rest of the product sees.

`backend_for(name, defects, source)` is how workers and triage get a backend: the workers' own
kernels (no source bundle, or a bundle identical to kernels/src) run in this process as
before; a fetched commit's kernels/src runs confined (isolation/sandbox.py), compiled and
launched by `isolation.kernel_main` in a process of its own. The `cpu` emulation runs none of a
bundle's code (it reads its `#define ATTN_DEFECT_*` lines as text), so it is never confined.

This process keeps what judges the kernel: it draws the inputs, sends them, and checks what
comes back (wire.py: no pickle; every array's dtype, shape and size against the config) before
the reference and the gates see it. The confined process holds the compiled code and nothing
else: no database, no settings but the kernel's own, no secret.

How a confined run that gives no answer ends (sweeps.runner turns each into the config's outcome):
- its process died of SIGSEGV, SIGBUS, SIGILL or SIGFPE: DeviceFault (the kernel faulted on
  its device, the host for hostemu) -> `fault`;
- killed by a limit of the confinement (CPU time, file size), by SIGKILL, aborted, exited, or
  answered something malformed: ConfinementError -> `error`, "confined run: <reason>"; out of
  memory under its limit (a MemoryError it reports): `oom`;
- no answer within its time limit: ConfinementTimeout -> `timeout`; the process is killed.
After any of these the next request starts a new process, as after a device fault that poisoned
the confined process's context. This process itself is never poisoned.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from attnconfig import AttentionConfig
from isolation.sandbox import Confinement, SandboxUnavailable, python_paths
from isolation.wire import PeerGone, WireError, receive, send
from kernels.backends.base import Backend, DeviceInfo, Prepared, RunOutput
from kernels.errors import (BackendUnavailable, CompileError, ConfinementError, ConfinementTimeout, DeviceFault,
                            DeviceOutOfMemory, LaunchError, NotApplicable, PluginError)
from kernels.plugins.load import DEFAULT_KERNEL, confinement_paths
from kernels.source import KernelSource, local_source
from settings import Settings, get_settings

log = logging.getLogger(__name__)

# The project's packages the confined process imports (bound read-only, nothing else of the checkout).
PACKAGES = ("attnconfig", "settings", "reference", "kernels", "isolation")
# Backends whose confined process gets the GPU's device nodes.
GPU_BACKENDS = frozenset({"auto", "cuda", "hip"})
# The kernel settings a confined process is given (the rest keep their defaults there).
KERNEL_SETTINGS = ("kernel_cache_disable", "mma", "cuda_include", "hostemu_max_work", "hostemu_max_blocks")
# Environment variables passed on by name: which GPUs the process may use, the host compiler.
PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CXX")
START_S = 180.0            # imports, the runtime, the device context
PREPARE_S = 600.0          # a compile, when no time limit is given
STDERR_KEPT = 64 << 10     # the end of what the confined process wrote to stderr, for its errors
TEXT_CHARS = 4000          # a message from the confined process; logs get LOG_CHARS
LOG_CHARS = 20_000
CPU_RESTART_SHARE = 0.8    # past this share of its CPU-seconds limit, a fresh process takes the next request
FATAL = {signal.SIGSEGV: "SIGSEGV", signal.SIGBUS: "SIGBUS", signal.SIGILL: "SIGILL", signal.SIGFPE: "SIGFPE"}


def is_shipped(source: KernelSource | None) -> bool:
    """Whether `source` is the workers' own kernels/src (what shipped in the image)."""
    return source is None or source.hash == local_source().hash


def backend_for(name: str, defects: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
                source: KernelSource | None = None, settings: Settings | None = None,
                kernel: str = DEFAULT_KERNEL) -> Backend:
    """The backend `name` with `defects` for `source`: in this process for the shipped kernels and
    for the cpu emulation, confined for anything else. `kernel` (kernels/plugins): a plug-in
    that shipped with attnsweep runs in this process, any other confined."""
    from kernels import get_backend
    from kernels.plugins import is_trusted, kernel_backend, parse_kernel

    if kernel != DEFAULT_KERNEL:
        parse_kernel(kernel)   # a name that is no kernel is the caller's mistake, said here
        if is_trusted(kernel):
            return kernel_backend(kernel, name, defects, source)
        if defects or source is not None:
            raise ValueError(f"kernel {kernel}: defect switches and source bundles belong to the project's own kernels")
        return ConfinedBackend(name, frozenset(), None, settings=settings, kernel=kernel)
    if is_shipped(source) or name == "cpu":
        return get_backend(name, defects=defects, source=source)
    return ConfinedBackend(name, frozenset(defects), source, settings=settings)


def _text(value: Any, limit: int = TEXT_CHARS) -> str:
    """Text from the confined process as it may be stored and shown: bounded, no NUL, valid UTF-8."""
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + " ..."


def _raise_failure(reply: Mapping[str, Any]) -> None:
    """Raise in this process the failure the confined process reported (an allow-listed type)."""
    kind, message = reply.get("error"), _text(reply.get("message", ""))
    if kind == "NotApplicable":
        raise NotApplicable(_text(reply.get("reason", ""), 64), _text(reply.get("detail", "")))
    if kind == "CompileError":
        raise CompileError(message, log=_text(reply.get("log", ""), LOG_CHARS), timed_out=bool(reply.get("timed_out")))
    if kind == "DeviceFault":
        raise DeviceFault(message, poisons=False)   # the confined process's context, not this one's
    if kind == "LaunchError":
        raise LaunchError(message, log=_text(reply.get("log", ""), LOG_CHARS))
    if kind == "DeviceOutOfMemory":
        raise DeviceOutOfMemory(message)
    if kind == "MemoryError":
        raise MemoryError(f"confined run: out of memory under the confined process's limit "
                          f"(ATTNSWEEP_SANDBOX_MEMORY_BYTES): {message}")
    if kind == "BackendUnavailable":
        raise BackendUnavailable(message)
    if kind == "PluginError":
        raise PluginError(_text(message, 1000))
    raise ConfinementError(f"the kernel raised {message}")


def _expected_shapes(config: AttentionConfig) -> dict[str, tuple[int, ...]]:
    c = config
    return {"out": (c.g, c.num_heads_q, c.seq_len_q, c.head_dim_v), "lse": (c.g, c.num_heads_q, c.seq_len_q)}


def check_outputs(config: AttentionConfig, arrays: Mapping[str, np.ndarray]) -> None:
    """ConfinementError unless the arrays are what a kernel of `config` returns: `out` in the
    config's logical shape, `lse` where it asked for one, the partials with one slice per split."""
    shapes = _expected_shapes(config)
    if "out" not in arrays:
        raise ConfinementError("the kernel returned no output")
    for name, shape in shapes.items():
        if name in arrays and arrays[name].shape != shape:
            raise ConfinementError(f"the kernel returned {name} of shape {arrays[name].shape}; the config's is {shape}")
    for name, base in (("o_partials", shapes["out"]), ("lse_partials", shapes["lse"])):
        if name in arrays:
            got = arrays[name].shape
            if got[1:] != base or not 1 <= got[0] <= config.split_kv:
                raise ConfinementError(f"the kernel returned {name} of shape {got}; the config's is (S, *{base}) "
                                       f"with S at most split_kv={config.split_kv}")
    extra = sorted(set(arrays) - {"out", "lse", "o_partials", "lse_partials"})
    if extra:
        raise ConfinementError(f"the kernel returned arrays it has no place for: {', '.join(extra)}")


def output_limit(config: AttentionConfig) -> int:
    """The most bytes a run's answer may hold: every output at 8 bytes an element, the partials
    once per split, and 1 MiB of room."""
    out = config.g * config.num_heads_q * config.seq_len_q
    return 8 * out * (config.head_dim_v + 1) * (config.split_kv + 2) + (1 << 20)


class ConfinedBackend(Backend):
    """Backend `name` built from `source` in a confined process (isolation.kernel_main)."""

    waits_on_device = False

    def __init__(self, name: str, defects: frozenset[str], source: KernelSource | None, *,
                 settings: Settings | None = None, time_limit_s: float | None = None, kernel: str = DEFAULT_KERNEL):
        super().__init__(defects)
        self.name = name
        self.source = source
        # A plug-in that did not ship (kernels/plugins) instead of a source bundle: the confined
        # process loads it by this spec.
        self.kernel = kernel
        self.settings = settings or get_settings()
        # A request's backstop when no SIGALRM of the caller stops it first: the config's limit and grace.
        limit = self.settings.config_time_limit_s
        self.time_limit_s = time_limit_s if time_limit_s is not None else (
            limit + self.settings.config_time_grace_s if limit > 0 else None)
        self.started = 0   # confined processes started, for the record and the tests
        self._proc: subprocess.Popen | None = None
        self._stderr: collections.deque[bytes] = collections.deque()
        self._drainer: threading.Thread | None = None
        self._info: DeviceInfo | None = None
        self._cpu_s = 0.0
        self._start()

    # -- the confined process -------------------------------------------------------------------
    def cache_dir(self) -> Path:
        """The one writable folder the confined process gets: its source's compile cache. One per
        source, so a source's process can only ever write binaries of its own source."""
        key = self.source.hash if self.source is not None else hashlib.sha256(self.kernel.encode()).hexdigest()
        return Path(self.settings.kernel_cache) / "confined" / key[:32]

    def confinement(self) -> Confinement:
        binds, pythonpath = python_paths(PACKAGES)
        if self.kernel != DEFAULT_KERNEL:   # the plug-in's own file or package, read-only
            extra_binds, extra_path = confinement_paths(self.kernel)
            binds, pythonpath = sorted({*binds, *extra_binds}), [*pythonpath, *extra_path]
        env = {"PYTHONPATH": os.pathsep.join(pythonpath),
               **{k: os.environ[k] for k in PASSED_ENV if k in os.environ}}
        return Confinement.of(self.settings, gpu=self.name in GPU_BACKENDS, read_only=tuple(binds),
                              writable=(str(self.cache_dir()),), env=env)

    def _start(self) -> None:
        self.cache_dir().mkdir(parents=True, exist_ok=True)
        try:
            proc = self.confinement().popen([sys.executable, "-m", "isolation.kernel_main"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except SandboxUnavailable as exc:
            raise BackendUnavailable(f"confined run: {exc}") from None
        self._proc, self.started, self._stderr = proc, self.started + 1, collections.deque()
        self._drainer = threading.Thread(target=self._drain, args=(proc, self._stderr), daemon=True,
                                         name="confined-stderr")
        self._drainer.start()
        kernel_settings = {k: getattr(self.settings, k) for k in KERNEL_SETTINGS}
        kernel_settings["kernel_cache"] = str(self.cache_dir())
        try:
            send(proc.stdin.fileno(), {"backend": self.name, "defects": sorted(self.defects), "kernel": self.kernel,
                                       "source_files": dict(self.source.files) if self.source is not None else None,
                                       "settings": kernel_settings})
            reply, _ = receive(proc.stdout.fileno(), 0, time.monotonic() + START_S)
        except (TimeoutError, PeerGone, BrokenPipeError, WireError) as exc:
            status = self.close()
            raise BackendUnavailable(f"confined run: the confined process did not start ({_death(status) or exc}): "
                                     f"{self.stderr_tail()}") from None
        if not reply.get("ok"):
            self.close()
            try:
                _raise_failure(reply)
            except ConfinementError as exc:
                raise BackendUnavailable(f"confined run: {exc}") from None
        info = reply.get("device_info") or {}
        info = DeviceInfo(**{k: (_text(v, 200) if isinstance(v, str) else v) for k, v in info.items()
                             if k in DeviceInfo.__dataclass_fields__ and isinstance(v, (str, int, type(None)))})
        # The kernel is the one this process asked for, whatever the other side calls it; its
        # name and version as the store's columns hold them.
        self._info = dataclasses.replace(info, kernel_spec=self.kernel, kernel=info.kernel[:200],
                                         kernel_version=info.kernel_version[:64])
        self._cpu_s = float(reply.get("cpu_s") or 0.0)

    @staticmethod
    def _drain(proc: subprocess.Popen, kept: collections.deque[bytes]) -> None:
        size = 0
        for chunk in iter(lambda: proc.stderr.read1(8192), b""):
            kept.append(chunk)
            size += len(chunk)
            while size > STDERR_KEPT and kept:
                size -= len(kept.popleft())

    def stderr_tail(self, lines: int = 5) -> str:
        text = b"".join(self._stderr).decode("utf-8", "replace").strip().splitlines()
        return _text(" | ".join(text[-lines:]), 1000) if text else "(nothing on stderr)"

    def _request(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None, max_bytes: int,
                 timeout_s: float | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if self._proc is None or self._cpu_s > CPU_RESTART_SHARE * self.settings.sandbox_cpu_s:
            self.close()
            self._start()
        proc = self._proc
        deadline = None if not timeout_s else time.monotonic() + timeout_s
        try:
            send(proc.stdin.fileno(), header, arrays)
            reply, got = receive(proc.stdout.fileno(), max_bytes, deadline)
        except TimeoutError:
            self.close(kill=True)
            raise ConfinementTimeout(f"no answer within {timeout_s:g} s: the confined process was killed") from None
        except (PeerGone, BrokenPipeError):
            status = self.close()
            if status is not None and -status in FATAL:
                raise DeviceFault(f"the confined process died of {FATAL[-status]} in the kernel: {self.stderr_tail(2)}",
                                  poisons=False) from None
            raise ConfinementError(f"{_death(status)}: {self.stderr_tail()}") from None
        except WireError as exc:
            self.close(kill=True)
            raise ConfinementError(f"the confined process answered something malformed: {exc}") from None
        except BaseException:
            # Stopped mid-request (the caller's time limit, an interrupt): the pipe is out of step.
            self.close(kill=True)
            raise
        self._cpu_s = float(reply.get("cpu_s") or 0.0) if isinstance(reply.get("cpu_s"), (int, float)) else 0.0
        if not reply.get("ok"):
            if reply.get("poisoned"):
                self.close()
            _raise_failure(reply)
        return reply, got

    # -- Backend ------------------------------------------------------------------------------
    def device_info(self) -> DeviceInfo:
        assert self._info is not None
        return self._info

    def prepare(self, config: AttentionConfig) -> Prepared:
        reply, _ = self._request({"op": "prepare", "config": config.to_dict()}, None, 0,
                                 self.time_limit_s or PREPARE_S)
        try:
            return Prepared(variant=_text(reply["variant"], 200), block_n=int(reply["block_n"]),
                            source_hash=_text(reply["source_hash"], 64), compile_s=float(reply.get("compile_s") or 0.0),
                            cache_hit=bool(reply.get("cache_hit")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfinementError(f"the confined process answered prepare without {exc}") from None

    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        arrays = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in inputs.items() if not isinstance(v, np.ndarray)}
        reply, got = self._request({"op": "run", "config": config.to_dict(), "scalars": scalars}, arrays,
                                   output_limit(config), self.time_limit_s)
        check_outputs(config, got)
        return RunOutput(out=got["out"], lse=got.get("lse"), o_partials=got.get("o_partials"),
                         lse_partials=got.get("lse_partials"), run_s=_seconds(reply.get("run_s")),
                         transfer_s=_seconds(reply.get("transfer_s")))

    def close(self, kill: bool = False) -> int | None:
        """End the confined process: its stdin closed, killed at once (`kill`) or when it does not end
        within a few seconds. Its exit status, a signal's number negated (as Popen reports one)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if kill:
            proc.kill()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if self._drainer is not None:   # its last words (an abort's message) are the reason shown
            self._drainer.join(timeout=2)
        # bubblewrap passes on its program's death by a signal as 128 + the signal's number.
        return -(code - 128) if code > 128 else code


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else 0.0


def _death(status: int | None) -> str:
    """How the confined process ended, from its exit status (ConfinedBackend.close)."""
    if status is None:
        return "the confined process is gone"
    if status < 0:
        sig = -status
        if sig == signal.SIGXCPU:
            return "the confined process was killed at its CPU-time limit (ATTNSWEEP_SANDBOX_CPU_S)"
        if sig == signal.SIGXFSZ:
            return "the confined process was killed for a file over its limit (ATTNSWEEP_SANDBOX_FILE_BYTES)"
        if sig == signal.SIGKILL:
            return "the confined process was killed (SIGKILL: the host's OOM killer, or a kill from outside)"
        return f"the confined process died of {signal.Signals(sig).name if sig in signal.valid_signals() else sig}"
    return f"the confined process exited with status {status}"
