"""The one runtime-compilation adapter of the GPU backends: NVRTC (cuda-python) and hiprtc
(hip-python) have the same calls under two prefixes, so compiling a variant, reading the
program log and turning a failed runtime call into the backend's exception are written once.

Every call of both bindings returns a tuple whose first item is the error code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kernels.backends.base import CompileError, DeviceFault, DeviceOutOfMemory, LaunchError
from kernels.cache import Compiled
from kernels.select import Variant
from kernels.source import KernelSource


def unpack(rest: tuple) -> Any:
    """What a binding call returned beside its error code: None, the one value, or the tuple."""
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def runtime_error(backend: Any, err: Any, what: str, text: str, *, out_of_memory: bool,
                  sticky: frozenset[str], exc: type[Exception] = LaunchError) -> Exception:
    """The exception for a failed runtime call: DeviceOutOfMemory; DeviceFault(poisons=True) for
    an error the runtime leaves in the context (`sticky`: every later call of the process fails
    with it, so the backend is marked poisoned and the process must be replaced); else `exc`."""
    if out_of_memory:
        return DeviceOutOfMemory(f"{what}: {text}")
    if getattr(err, "name", str(err)).split(".")[-1] in sticky:
        backend.poisoned = True
        return DeviceFault(f"{what} failed: {text}", poisons=True)
    return exc(f"{what} failed: {text}")


@dataclass(frozen=True)
class RuntimeCompiler:
    """One runtime compiler's binding module (`lib`), the prefix of its calls ("nvrtc" or
    "hiprtc"), its success code, the name of its binary ("CUBIN" or "Code": nvrtcGetCUBIN,
    hiprtcGetCode), the buffer its calls write into, and its name in messages."""

    lib: Any
    prefix: str
    success: Any
    binary: str
    buffer: Callable[[int], Any]
    label: str

    def call(self, name: str) -> Callable[..., tuple]:
        return getattr(self.lib, self.prefix + name)

    def check(self, result: tuple, what: str, prog: Any = None) -> Any:
        err, rest = result[0], result[1:]
        if err != self.success:
            raise CompileError(f"{what} failed: {err}", log=self.program_log(prog) if prog is not None else "")
        return unpack(rest)

    def version(self) -> str:
        major, minor = self.check(self.call("Version")(), self.prefix + "Version")
        return f"{self.prefix} {major}.{minor}"

    def program_log(self, prog: Any) -> str:
        try:
            err, size = self.call("GetProgramLogSize")(prog)
            if err != self.success or size <= 1:
                return ""
            buf = self.buffer(size)
            self.call("GetProgramLog")(prog, buf)
            return bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        except Exception as exc:   # the log is best effort; the error itself is raised by the caller
            return f"(could not read the {self.label} log: {exc})"

    def compile(self, source: KernelSource, variant: Variant, options: list[str]) -> Compiled:
        """`source` compiled with `options`, keeping the lowered names of the variant's kernels."""
        p = self.prefix
        headers = dict(source.headers)
        names = list(headers)
        prog = self.check(self.call("CreateProgram")(
            source.entry_text.encode(), source.entry_name.encode(), len(names),
            [headers[n].encode() for n in names], [n.encode() for n in names]), p + "CreateProgram")
        try:
            for expr in variant.name_expressions:
                self.check(self.call("AddNameExpression")(prog, expr.encode()), p + "AddNameExpression", prog)
            opts = [o.encode() for o in options]
            err, = self.call("CompileProgram")(prog, len(opts), opts)
            log = self.program_log(prog)
            if err != self.success:
                raise CompileError(f"{self.label} failed to compile {variant.name}: {err}", log=log)
            size = self.check(self.call(f"Get{self.binary}Size")(prog), f"{p}Get{self.binary}Size", prog)
            binary = self.buffer(size)
            self.check(self.call(f"Get{self.binary}")(prog, binary), f"{p}Get{self.binary}", prog)
            lowered = {}
            for expr in variant.name_expressions:
                name = self.check(self.call("GetLoweredName")(prog, expr.encode()), p + "GetLoweredName", prog)
                lowered[expr] = name.decode() if isinstance(name, bytes) else str(name)
            return Compiled(binary=bytes(binary), lowered_names=lowered, log=log)
        finally:
            self.call("DestroyProgram")(prog)
