"""tools/sass_diff.py's normalization: what a rename or relink changes is left out, an
instruction is not, and only the split kernel's code section counts. The tool runs as a
command (--normalize LISTING), as the team runs it; no nvcc needed.

    .venv/bin/python -m pytest tools/tests      (make tools-test)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "sass_diff.py"

LISTING = """\t.target\tsm_90
//--------------------- .text.{name} ---
\t.section\t.text.{name},"ax",@progbits
        .global         {name}
{name}:
.text.{name}:
        /*{a0}*/                   LDC R1, c[0x0][0x28] ;
        /*{a1}*/               @P0 BRA `(.L_x_{label}) ;
.L_x_{label}:
        /*{a2}*/                   {insn} ;
\t.section\t.nv.info.{name},"",@"SHT_CUDA_INFO"
        /*0000*/ .byte 0x04, 0x2f
"""
OLD = "_Z20attn_splitkv_fwd_mmaI6__halfLi128ELi128ELi32ELi64ELi4ELi1ELi1EEvPKT_"
NEW = "_Z20attn_splitkv_fwd_mmaI6__halfLi128ELi128ELi32ELi64ELi4ELi1ELi1ELi1EEvPKT_"


@pytest.fixture
def normalize(tmp_path):
    def run(text: str) -> list[str]:
        path = tmp_path / "listing.sass"
        path.write_text(text)
        out = subprocess.run([sys.executable, str(TOOL), "--normalize", str(path)], check=True,
                             capture_output=True, text=True).stdout
        return out.splitlines()
    return run


def listing(name=OLD, label=0, insn="MUFU.EX2 R0, R2", addrs=("0000", "0010", "0020")):
    return LISTING.format(name=name, label=label, insn=insn, a0=addrs[0], a1=addrs[1], a2=addrs[2])


def test_a_rename_relabel_or_move_leaves_the_code_equal(normalize):
    base = normalize(listing())
    assert base == normalize(listing(name=NEW, label=7, addrs=("0100", "0110", "0120")))
    assert "MUFU.EX2 R0, R2 ;" in base and "LDC R1, c[0x0][0x28] ;" in base


def test_an_instruction_differs(normalize):
    assert normalize(listing()) != normalize(listing(insn="FMUL R0, R2, 1.44"))


def test_only_the_split_kernels_code_section_counts(normalize):
    lines = normalize(listing())
    assert not any(".byte" in x or ".target" in x for x in lines)
    assert normalize(listing(name="_Z20attn_splitkv_combineI6__halffLi256EEvPKf")) == []
