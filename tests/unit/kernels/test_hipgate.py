"""The AMD compile gate (kernels/hipgate.py): the variants it compiles are those the selector
picks for ROCm, and what it hands hipcc is what the hip backend hands hiprtc. The compiling
tests need hipcc (Debian: apt-get install hipcc libamdhip64-dev; .ci/run installs it)."""
from __future__ import annotations

import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest

from attnconfig import AttentionConfig
from kernels.backends.hip import HipBackend
from kernels.hipgate import TARGETS, defect_representatives, rocm_variants, run_gate
from kernels.source import KernelSource
from kernels.select import Variant, select_variant
from kernels.source import local_source

needs_hipcc = pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc not installed")


def _hip_options(arch: str, variant: Variant) -> list[str]:
    # The hip backend's own method; only its `arch` is read (no ROCm runtime is needed).
    return HipBackend.compile_options(SimpleNamespace(arch=arch), variant)


def test_the_gate_covers_every_variant_the_selector_picks_for_rocm():
    gate = {v.name for v in rocm_variants()}
    assert len(gate) == len(rocm_variants()) == 4 * 25 + 3 * 16 * 3
    picked = set()
    for dtype in ("f16", "bf16", "f32", "i8"):
        for dqk in (1, 33, 65, 129, 300):
            for dv in (1, 40, 100, 200, 1024):
                for hq, hkv, sq in ((1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 2, 3)):
                    for path in ("auto", "rowwise"):
                        c = AttentionConfig(dtype=dtype, g=1, seq_len_q=sq, seq_len_k=64, num_heads_q=hq,
                                            num_heads_kv=hkv, head_dim_qk=dqk, head_dim_v=dv)
                        picked.add(select_variant(c, path=path, mma=False).name)
    assert picked == gate
    assert not any(v.path == "mma" for v in rocm_variants())


def test_a_defect_switch_is_compiled_into_every_path_and_dtype():
    reps = defect_representatives(("hang",))
    assert {(v.path, v.dtype) for v in reps} == {(p, d) for p in ("rowwise",) for d in ("f16", "bf16", "f32", "i8")} | {
        ("grouped", d) for d in ("f16", "bf16", "f32")}
    assert all(v.defects == ("hang",) for v in reps) and any(v.dqk_bucket == 0 for v in reps)


@needs_hipcc
def test_the_gate_compiles_with_the_hip_backends_options(tmp_path):
    chosen = [Variant("bf16", 64, 128, block_m=2, path="grouped"), Variant("i8", 0, 32)]
    report = run_gate(("gfx1030", "gfx1100"), [(), ("causal_off_by_one",)], variants=chosen, jobs=2)
    assert report.ok, [u.log for u in report.units if not u.ok]
    compiled = report.compiled()
    assert set(compiled) == {"gfx1030", "gfx1100"}
    for target, by_name in compiled.items():
        assert len(by_name) == 4
        for v in chosen:
            for variant in (v, replace(v, defects=("causal_off_by_one",))):
                assert by_name[variant.name] == _hip_options(target, variant)
    assert "-DATTN_DEFECT_CAUSAL_OFF_BY_ONE=1" in compiled["gfx1030"][
        Variant("i8", 0, 32, defects=("causal_off_by_one",)).name]
    assert report.version.startswith("HIP version")
    assert "gfx1030" not in report.generated_isa


@needs_hipcc
def test_the_gate_fails_on_a_source_that_does_not_compile_for_amd():
    src = local_source()
    broken = KernelSource.from_files({**src.files, "attention.hip": src.entry_text.replace(
        "const int kvh = h / (hq / hkv);", "const int kvh = h / (hq / hkv)", 1)})
    report = run_gate(("gfx90a",), [()], source=broken, variants=[Variant("f32", 32, 32)], jobs=1)
    assert not report.ok and "error" in report.units[0].log and not report.compiled()


def test_targets_are_mi200_and_rdna():
    assert TARGETS == ("gfx90a", "gfx1030", "gfx1100")
