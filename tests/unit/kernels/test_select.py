"""Backend selection, and the promise that `import kernels` (and kernels.select, which the API
process uses) loads no GPU runtime."""
from __future__ import annotations

import subprocess
import sys
import types

import pytest

import kernels
from kernels import backends
from kernels.backends.base import Backend, BackendUnavailable

RUNTIME_MODULES = ("kernels.backends.cuda", "kernels.backends.hip", "cuda", "cuda.bindings", "hip", "hip.hip")


def test_import_kernels_imports_no_gpu_runtime():
    code = ("import sys, kernels; from kernels import get_backend; "
            f"print([m for m in {RUNTIME_MODULES!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_variant_selection_loads_no_backend_and_no_compile_cache():
    heavy = (*RUNTIME_MODULES, "kernels.backends.device", "kernels.cache", "kernels.launch", "filelock")
    code = ("import sys; from kernels.select import variant_key, select_variant; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_package_exports_the_interface():
    for name in ("get_backend", "Backend", "Prepared", "RunOutput", "DeviceInfo", "NotApplicable",
                 "CompileError", "LaunchError", "DeviceOutOfMemory", "BackendUnavailable", "DEFECTS"):
        assert hasattr(kernels, name)


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown backend 'rocm'"):
        kernels.get_backend("rocm")
    with pytest.raises(ValueError, match="unknown defect"):
        kernels.get_backend("cuda", {"no_such_defect"})


class Fake(Backend):
    def __init__(self, name, defects=frozenset()):
        super().__init__(defects)
        self.name = name

    def device_info(self):
        raise NotImplementedError

    def prepare(self, config):
        raise NotImplementedError

    def run(self, prepared, config, inputs):
        raise NotImplementedError


def _unavailable(name):
    def factory(defects):
        raise BackendUnavailable(f"no {name} here")
    return factory


def test_auto_takes_the_first_usable(monkeypatch):
    monkeypatch.setattr(backends, "FACTORIES", {
        "cuda": _unavailable("cuda"), "hip": lambda d: Fake("hip", d), "cpu": lambda d: Fake("cpu", d)})
    b = kernels.get_backend("auto", {"no_zero_sum_guard"})
    assert b.name == "hip" and b.defects == frozenset({"no_zero_sum_guard"})
    monkeypatch.setitem(backends.FACTORIES, "hip", _unavailable("hip"))
    assert kernels.get_backend("auto").name == "cpu"
    monkeypatch.setitem(backends.FACTORIES, "cuda", lambda d: Fake("cuda", d))
    assert kernels.get_backend("auto").name == "cuda"
    for name in ("cuda", "hip", "cpu"):
        monkeypatch.setitem(backends.FACTORIES, name, _unavailable(name))
    with pytest.raises(BackendUnavailable, match="cuda: no cuda here; hip: no hip here; cpu: no cpu here"):
        kernels.get_backend("auto")


def test_auto_falls_back_to_the_cpu_emulation_here():
    pytest.importorskip("kernels.backends.cpu")
    try:
        import cuda.bindings  # noqa: F401
        pytest.skip("cuda-python is installed here; the fallback is tested with fakes above")
    except ImportError:
        pass
    b = kernels.get_backend("auto")
    assert b.name == "cpu"
    assert kernels.get_backend("cpu", {"causal_off_by_one"}).defects == frozenset({"causal_off_by_one"})


def test_hip_without_rocm_is_unavailable(monkeypatch):
    # hip-python imports without ROCm and raises RuntimeError at the first call
    hip_pkg = types.ModuleType("hip")
    hip_mod = types.ModuleType("hip.hip")

    def no_lib(*a, **k):
        raise RuntimeError("failed to dlopen libamdhip64.so")

    hip_mod.hipGetDeviceCount = no_lib
    hip_pkg.hip = hip_mod
    hip_pkg.hiprtc = types.ModuleType("hip.hiprtc")
    monkeypatch.setitem(sys.modules, "hip", hip_pkg)
    monkeypatch.setitem(sys.modules, "hip.hip", hip_mod)
    monkeypatch.setitem(sys.modules, "hip.hiprtc", hip_pkg.hiprtc)
    with pytest.raises(BackendUnavailable, match="no ROCm runtime found: failed to dlopen libamdhip64.so"):
        kernels.get_backend("hip")


def test_hip_without_hip_python_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)   # import hip -> ImportError
    with pytest.raises(BackendUnavailable, match="no ROCm runtime found"):
        kernels.get_backend("hip")


def test_cuda_without_driver_is_unavailable(monkeypatch):
    cuda_pkg = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    driver = types.ModuleType("cuda.bindings.driver")

    def no_lib(*a, **k):
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    driver.cuInit = no_lib
    bindings.driver = driver
    bindings.nvrtc = types.ModuleType("cuda.bindings.nvrtc")
    cuda_pkg.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda_pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", bindings.nvrtc)
    with pytest.raises(BackendUnavailable, match="no CUDA runtime found: Failed to dlopen"):
        kernels.get_backend("cuda")


def test_cuda_without_cuda_python_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)
    with pytest.raises(BackendUnavailable, match="cuda-python is not installed"):
        kernels.get_backend("cuda")


def test_hostemu_is_chosen_by_name_only():
    assert "hostemu" in backends.BACKEND_NAMES and "hostemu" not in backends.AUTO_ORDER
    from kernels.backends.hostemu import HostEmuBackend

    backend = kernels.get_backend("hostemu", {"causal_off_by_one"})
    assert isinstance(backend, HostEmuBackend) and backend.defects == frozenset({"causal_off_by_one"})
    assert backend.device_info().backend == "hostemu" and not backend.waits_on_device
    assert kernels.get_backend("auto").name != "hostemu"


def test_hostemu_refuses_configs_too_large_to_emulate(monkeypatch):
    from attnconfig import AttentionConfig
    from settings import get_settings
    from kernels.backends.base import NotApplicable
    from kernels.backends.hostemu import emulated_blocks, emulated_work

    big = AttentionConfig(dtype="f16", g=4, seq_len_q=512, seq_len_k=65536, num_heads_q=32, num_heads_kv=8,
                          head_dim_qk=128, head_dim_v=128)
    assert emulated_work(big) > get_settings().hostemu_max_work
    with pytest.raises(NotApplicable) as e:
        kernels.get_backend("hostemu").prepare(big)
    assert e.value.reason == "hostemu_too_large" and "ATTNSWEEP_HOSTEMU_MAX_WORK" in e.value.detail
    # the limits are settings, read when a config is prepared
    small = AttentionConfig(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=2,
                            head_dim_qk=32, head_dim_v=32)
    monkeypatch.setenv("ATTNSWEEP_HOSTEMU_MAX_BLOCKS", str(emulated_blocks(small) - 1))
    get_settings.cache_clear()
    with pytest.raises(NotApplicable, match="ATTNSWEEP_HOSTEMU_MAX_BLOCKS"):
        kernels.get_backend("hostemu").prepare(small)
