"""The GPU path compiles a bundle's own text: a defect switched on in a commit's source breaks the
compiled kernel, without any --defect. Runs attention.hip as host C++ (tests/unit/kernels'
host emulation of the device backend), so it needs g++ but no GPU."""
from __future__ import annotations

import shutil
from pathlib import Path
from unittest import mock

import pytest

from attnconfig import parse_config
from kernels.source import KernelSource
from kernels.source import local_source
from sweeps.runner import run_config
from tests.unit.ci.hooks import with_defects

emu = pytest.importorskip("tests.unit.kernels.test_variants")
if shutil.which("g++") is None:
    pytest.skip("g++ is needed to compile attention.hip for the host", allow_module_level=True)

# 100 keys = 4 blocks of 32 over 3 splits: floor(4 / 3) = 1 block per split leaves the last block out.
SPLIT = dict(dtype="f32", g=1, seq_len_q=2, seq_len_k=100, num_heads_q=2, num_heads_kv=1, head_dim_qk=16,
             head_dim_v=16, split_kv=3, return_lse=True)


class BundleHostEmu(emu.HostEmuBackend):
    """The host emulation compiling from `source` (written to a folder of its own) instead of kernels/src."""

    def __init__(self, source: KernelSource | None = None):
        super().__init__()
        self.kernel_source = source

    def _rt_compile(self, variant, options):  # noqa: ANN001, ANN202
        folder = Path(self._tmp) / f"src-{self.source.hash[:12]}"
        folder.mkdir(exist_ok=True)
        for name, text in self.source.files.items():
            (folder / name).write_text(text)
        shutil.copy(emu.SRC_DIR / "host_emu.h", folder / "host_emu.h")  # the host stand-in for the GPU runtime
        with mock.patch.object(emu, "SRC_DIR", folder):
            return super()._rt_compile(variant, options)


def test_a_bundle_with_a_defect_switch_compiles_to_a_defective_kernel():
    bundle = KernelSource.from_files({**local_source().files,
                                      "attention.hip": with_defects("floor_blocks_per_split")(local_source().entry_text)})
    c = parse_config(SPLIT)
    good, bad = BundleHostEmu(), BundleHostEmu(bundle)
    assert bad.defects == frozenset()  # nothing asked for: the defect is in the text
    assert bad.cache_key_fields(bad.variant_for(c), [])["source_hash"] == bundle.hash
    assert good.cache_key_fields(good.variant_for(c), [])["source_hash"] == local_source().hash
    ok, broken = run_config(c, good), run_config(c, bad)
    assert (ok.outcome, ok.source_hash) == ("pass", local_source().hash)
    assert broken.outcome == "fail" and broken.source_hash == bundle.hash
