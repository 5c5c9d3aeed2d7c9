"""kernels/backends/rtc.py: the one adapter over NVRTC and hiprtc, against a stand-in binding
with their calling convention (every call returns a tuple whose first item is the error code)."""
from __future__ import annotations

import types

import pytest

from kernels.backends.base import CompileError, DeviceFault, DeviceOutOfMemory, LaunchError
from kernels.backends.rtc import RuntimeCompiler, runtime_error
from kernels.select import Variant
from kernels.source import KernelSource

OK, FAIL = "SUCCESS", "ERROR_COMPILATION"


def fake_rtc(prefix: str, *, compile_result: str = OK, log: bytes = b"warning: x\0"):
    """A binding module with `prefix`'s calls: programs are dicts, buffers filled in place."""
    calls: list[str] = []

    def fill(buf, data: bytes):
        buf[:len(data)] = data

    def create(src, name, n, headers, names):
        calls.append("create")
        assert name == b"attention.hip" and n == len(headers) == len(names)
        return OK, {"src": src, "exprs": [], "headers": dict(zip(names, headers))}

    def add(prog, expr):
        prog["exprs"].append(expr)
        return (OK,)

    def compile_(prog, n, opts):
        calls.append("compile")
        prog["opts"] = opts
        return (compile_result,)

    def lowered(prog, expr):
        return OK, b"_Z" + expr.split(b"<")[0]

    def destroy(prog):
        calls.append("destroy")
        return (OK,)

    binary = b"\x7fELF-code"
    m = types.SimpleNamespace(calls=calls)
    for name, fn in {
        "Version": lambda: (OK, 12, 6),
        "CreateProgram": create, "AddNameExpression": add, "CompileProgram": compile_,
        "GetProgramLogSize": lambda prog: (OK, len(log)),
        "GetProgramLog": lambda prog, buf: (fill(buf, log), (OK,))[1],
        "GetCodeSize": lambda prog: (OK, len(binary)),
        "GetCode": lambda prog, buf: (fill(buf, binary), (OK,))[1],
        "GetLoweredName": lowered, "DestroyProgram": destroy,
    }.items():
        setattr(m, prefix + name, fn)
    return m


def test_compile_returns_the_binary_the_lowered_names_and_the_log():
    lib = fake_rtc("hiprtc")
    rtc = RuntimeCompiler(lib, "hiprtc", OK, "Code", bytearray, "hiprtc")
    source = KernelSource("// kernel", {"hip_compat.h": "// header"})
    v = Variant("f16", 64, 64)
    out = rtc.compile(source, v, ["-O3", "-DX=1"])
    assert out.binary == b"\x7fELF-code" and out.log == "warning: x"
    assert out.lowered_names == {e: "_Z" + e.split("<")[0] for e in v.name_expressions}
    assert lib.calls == ["create", "compile", "destroy"]
    assert rtc.version() == "hiprtc 12.6"


def test_a_failed_compile_raises_with_the_log_and_destroys_the_program():
    lib = fake_rtc("nvrtc", compile_result=FAIL, log=b"error: expected ';'\0")
    rtc = RuntimeCompiler(lib, "nvrtc", OK, "Code", bytearray, "NVRTC")
    with pytest.raises(CompileError, match="NVRTC failed to compile attn_f16") as e:
        rtc.compile(KernelSource("// kernel"), Variant("f16", 64, 64), [])
    assert e.value.log == "error: expected ';'" and lib.calls[-1] == "destroy"


def test_runtime_errors_are_classified_once_for_both_runtimes():
    backend = types.SimpleNamespace(poisoned=False)
    sticky = frozenset({"CUDA_ERROR_ILLEGAL_ADDRESS"})
    err = types.SimpleNamespace(name="CUresult.CUDA_ERROR_ILLEGAL_ADDRESS")
    oom = runtime_error(backend, "x", "cuMemAlloc(8)", "out of memory", out_of_memory=True, sticky=sticky)
    assert isinstance(oom, DeviceOutOfMemory) and not backend.poisoned
    other = runtime_error(backend, "CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel", "bad", out_of_memory=False, sticky=sticky)
    assert type(other) is LaunchError and not backend.poisoned
    fault = runtime_error(backend, err, "cuLaunchKernel(fwd)", "illegal address", out_of_memory=False, sticky=sticky)
    assert isinstance(fault, DeviceFault) and fault.poisons and backend.poisoned
