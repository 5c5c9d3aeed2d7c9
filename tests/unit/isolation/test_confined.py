"""A fetched commit's kernels run confined (isolation/confined.py): through the runner every
sweep uses, on hostemu (the commit's own C++ on this host), as a CI sweep or a bisection would."""
from __future__ import annotations

import numpy as np
import pytest

from attnconfig import parse_config
from isolation.confined import ConfinedBackend, backend_for, check_outputs, _raise_failure
from kernels.backends.base import BackendUnavailable
from kernels.errors import ConfinementError
from kernels.source import SRC_DIR, KernelSource, local_source
from sweeps.runner import run_config

CONFIG = parse_config(dict(dtype="f16", g=1, seq_len_q=2, seq_len_k=48, num_heads_q=2, num_heads_kv=1, head_dim_qk=16,
                           head_dim_v=16, return_lse=True, split_kv=2))


def bundle(extra: str = "", defines: tuple[str, ...] = ()) -> KernelSource:
    """kernels/src as a fetched commit has it: host_emu.h included, `defines` and `extra` code added."""
    files = dict(local_source().files)
    files["host_emu.h"] = (SRC_DIR / "host_emu.h").read_text()
    head, sep, rest = files["attention.hip"].partition('#include "hip_compat.h"')
    files["attention.hip"] = head + "".join(f"#define ATTN_DEFECT_{d}\n" for d in defines) + sep + rest + extra
    return KernelSource.from_files(files)


def planted(body: str) -> str:
    """C++ that runs when the compiled kernel library is loaded, as an attacker would write it."""
    return ("\n#ifdef ATTN_HOST_EMULATION\n#include <cstdlib>\n#include <cstdio>\n"
            f"__attribute__((constructor)) static void planted() {{ {body} }}\n#endif\n")


@pytest.fixture
def settings(tmp_path):  # noqa: ANN201
    from settings import Settings

    return Settings(kernel_cache=tmp_path / "kernels", config_time_limit_s=20, config_time_grace_s=0)


def test_only_code_that_did_not_ship_is_confined(settings):
    from kernels.backends.cpu import CpuEmulationBackend

    assert isinstance(backend_for("cpu", source=bundle(defines=("CAUSAL_OFF_BY_ONE",))), CpuEmulationBackend)
    assert not isinstance(backend_for("hostemu"), ConfinedBackend)
    confined = backend_for("hostemu", source=bundle("// another commit\n"), settings=settings)
    try:
        assert isinstance(confined, ConfinedBackend)
    finally:
        confined.close()


@pytest.mark.needs_bwrap
def test_a_commits_code_runs_confined_and_is_judged_as_any_kernel(settings, tmp_path):
    marker = tmp_path / "pwned"
    source = bundle(planted(f'std::system("id > {marker}; cat /etc/shadow >> {marker}"); '
                            f'FILE* f = std::fopen("{marker}", "w"); if (f) std::fputs("x", f);'))
    backend = backend_for("hostemu", source=source, settings=settings)
    try:
        result = run_config(CONFIG, backend)
        assert result.outcome == "pass", result.detail
        assert result.source_hash == source.hash and result.backend == "hostemu"
    finally:
        backend.close()
    assert not marker.exists()
    # Its compile cache is its own folder: another source's process cannot write there.
    assert list(backend.cache_dir().iterdir()) and backend.cache_dir().name == source.hash[:32]


@pytest.mark.needs_bwrap
def test_a_kernel_that_kills_its_process_is_a_fault_and_the_next_config_runs(settings):
    backend = ConfinedBackend("hostemu", frozenset(), bundle(defines=("OOB_STORE",)), settings=settings)
    try:
        crashed = run_config(CONFIG, backend)
        assert crashed.outcome == "fault" and "SIGSEGV" in crashed.detail, crashed.detail
        assert not crashed.poisons_process and not backend.poisoned
        single = parse_config({**CONFIG.to_dict(), "split_kv": 1})
        assert run_config(single, backend).outcome in ("pass", "fault")
        assert backend.started == 2
    finally:
        backend.close()


@pytest.mark.needs_bwrap
def test_a_kernel_that_never_returns_is_a_timeout_and_its_process_is_killed(settings):
    backend = ConfinedBackend("hostemu", frozenset(), bundle(defines=("HANG",)), settings=settings, time_limit_s=8)
    try:
        backend.prepare(CONFIG)   # compiled outside the run's limit
        hung = run_config(CONFIG, backend)
        assert hung.outcome == "timeout" and hung.detail.startswith("confined run: no answer within 8 s"), hung.detail
        assert backend._proc is None
    finally:
        backend.close()


def test_without_bubblewrap_nothing_runs_and_the_reason_is_one_line(settings):
    broken = settings.model_copy(update={"bwrap": "/nonexistent/bwrap"})
    with pytest.raises(BackendUnavailable, match="confined run: /nonexistent/bwrap is not installed"):
        ConfinedBackend("hostemu", frozenset(), bundle("// x\n"), settings=broken)


def test_what_comes_back_must_fit_the_config():
    shape = (1, 2, 2, 16)
    good = {"out": np.zeros(shape, np.float16), "lse": np.zeros(shape[:3], np.float32),
            "o_partials": np.zeros((2, *shape), np.float32), "lse_partials": np.zeros((2, *shape[:3]), np.float32)}
    check_outputs(CONFIG, good)
    for bad, rule in [({"out": np.zeros((1, 2, 2, 8), np.float16)}, "out of shape"),
                      ({"lse": np.zeros((2, 2), np.float32)}, "lse of shape"),
                      ({"o_partials": np.zeros((3, *shape), np.float32)}, "at most split_kv=2"),
                      ({"extra": np.zeros(1)}, "no place for: extra")]:
        with pytest.raises(ConfinementError, match=rule):
            check_outputs(CONFIG, {**good, **bad})
    with pytest.raises(ConfinementError, match="no output"):
        check_outputs(CONFIG, {})


def test_a_failure_is_raised_again_only_as_an_allowed_type_with_bounded_text():
    from kernels.errors import CompileError, DeviceFault, NotApplicable

    with pytest.raises(NotApplicable) as na:
        _raise_failure({"error": "NotApplicable", "reason": "too_large", "detail": "d"})
    assert na.value.reason == "too_large"
    with pytest.raises(CompileError) as ce:
        _raise_failure({"error": "CompileError", "message": "m\x00", "log": "L" * 100_000})
    assert "\x00" not in str(ce.value) and len(ce.value.log) < 21_000
    with pytest.raises(DeviceFault) as df:
        _raise_failure({"error": "DeviceFault", "message": "illegal address", "poisons": True})
    assert df.value.poisons is False
    with pytest.raises(ConfinementError, match="the kernel raised SystemExit"):
        _raise_failure({"error": "SystemExit", "message": "SystemExit: 3"})
