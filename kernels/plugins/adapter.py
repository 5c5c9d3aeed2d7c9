"""A kernel plug-in as the rest of the product sees a kernel: a kernels.backends.base.Backend.

Sweeps, gates, triage and the store know backends only, so a plug-in is wrapped once here:
`prepare` asks `supports()` (a reason is NotApplicable, stored as `not_applicable`), `run`
calls the plug-in and checks what it returns (interface.as_run_output). What a plug-in raises
becomes the outcome it stands for: a device's out-of-memory `oom`, an illegal address or a
device-side assert `fault` (the process's context is then unusable), a compiler's error
`error` with its log, anything else a PluginError, `error` with one line naming it.
"""
from __future__ import annotations

import platform
import time
from typing import Any, Mapping

from attnconfig import AttentionConfig
from kernels.backends.base import Backend, DeviceInfo, Prepared, RunOutput
from kernels.errors import (BackendUnavailable, CompileError, DeviceFault, DeviceOutOfMemory, LaunchError,
                            NotApplicable, PluginError)
from kernels.plugins.interface import as_run_output, one_line, reason_parts

DEFAULT_BLOCK_N = 32
# What a CUDA or HIP runtime says when a kernel broke its context (every later call fails too).
STICKY = ("illegal memory access", "illegal address", "device-side assert", "misaligned address",
          "unspecified launch failure", "illegal instruction", "an illegal")
OOM = ("out of memory", "outofmemory")
OURS = (NotApplicable, CompileError, DeviceFault, LaunchError, DeviceOutOfMemory, PluginError, MemoryError)


def translate(where: str, exc: Exception) -> Exception:
    """The kernels.errors type of what a plug-in raised in `where` (supports() or run())."""
    if isinstance(exc, OURS):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if any(s in low for s in OOM):
        return DeviceOutOfMemory(one_line(text))
    if any(s in low for s in STICKY):
        return DeviceFault(one_line(text), poisons=True)
    if type(exc).__name__ == "CompilationError":   # Triton's: the kernel does not compile
        return CompileError(one_line(text), log=str(exc)[-20_000:])
    return PluginError(f"{where} raised {one_line(text)}")


def _device_facts(plugin: Any, device: str) -> dict[str, Any]:
    """What a plug-in says of its device (device_info()), else what torch says of the GPU."""
    facts: dict[str, Any] = {"backend": device, "device": device, "total_memory": None}
    if device in ("cuda", "hip"):
        try:
            import torch

            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            facts.update(device=props.name, total_memory=int(props.total_memory),
                         multiprocessors=int(props.multi_processor_count),
                         arch=f"sm_{props.major}{props.minor}" if device == "cuda" else getattr(props, "gcnArchName", ""),
                         compiler_version=f"torch {torch.__version__}",
                         driver_version=str(torch.version.cuda or torch.version.hip or ""))
        except Exception:  # noqa: BLE001 - no torch, or no GPU: the plug-in's own words, or nothing
            pass
    else:
        facts.update(device=f"cpu ({platform.machine()})", arch=platform.machine())
    own = getattr(plugin, "device_info", None)
    if callable(own):
        try:
            facts.update({k: v for k, v in dict(own()).items() if k in DeviceInfo.__dataclass_fields__})
        except Exception as exc:  # noqa: BLE001
            raise BackendUnavailable(f"kernel {plugin.name}: device_info() raised {one_line(exc)}") from None
    facts["backend"] = device
    return facts


class PluginBackend(Backend):
    """The plug-in `plugin`, asked for as `spec` (`--kernel`), on its declared device; `version`
    replaces the one it says (a built tree's commit)."""

    def __init__(self, plugin: Any, spec: str, version: str | None = None):
        super().__init__(frozenset())
        self.plugin = plugin
        self.spec = spec
        self.version = str(version if version is not None else plugin.version)[:64]
        self.name = str(getattr(plugin, "device", "cpu") or "cpu")
        self.waits_on_device = self.name != "cpu"
        self._info: DeviceInfo | None = None

    def device_info(self) -> DeviceInfo:
        if self._info is None:
            facts = _device_facts(self.plugin, self.name)
            self._info = DeviceInfo(**{**facts, "kernel_spec": self.spec, "kernel": str(self.plugin.name)[:200],
                                       "kernel_version": self.version})
        return self._info

    def device_count(self) -> int:
        if self.name == "cpu":
            return 0
        try:
            import torch

            return torch.cuda.device_count()
        except ImportError:
            return 1

    def prepare(self, config: AttentionConfig) -> Prepared:
        try:
            why = self.plugin.supports(config)
        except Exception as exc:  # noqa: BLE001 - a broken supports() is the plug-in's failure, not ours
            raise translate("supports()", exc) from None
        if why:
            raise NotApplicable(*reason_parts(str(why)))
        block_n = getattr(self.plugin, "block_n", DEFAULT_BLOCK_N)
        return Prepared(variant=str(self.plugin.name)[:200], block_n=block_n if isinstance(block_n, int) and block_n > 0
                        else DEFAULT_BLOCK_N, source_hash=self.version)

    def run(self, prepared: Prepared, config: AttentionConfig, inputs: Mapping[str, Any]) -> RunOutput:
        t0 = time.perf_counter()
        try:
            returned = self.plugin.run(config, inputs)
        except Exception as exc:  # noqa: BLE001 - see translate
            error = translate("run()", exc)
            if isinstance(error, DeviceFault) and error.poisons:
                self.poisoned = True
            raise error from None
        wall = time.perf_counter() - t0
        return as_run_output(config, returned, wall)

    def close(self) -> None:
        close = getattr(self.plugin, "close", None)
        if callable(close):
            close()
