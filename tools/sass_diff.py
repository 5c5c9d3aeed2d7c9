"""Does a change to attention.hip change what NVIDIA GPUs run? The SASS of every kernel variant
built from a git revision's kernel sources against the working tree's, instruction by instruction.

    .venv/bin/python tools/sass_diff.py [--rev HEAD] [--arch sm_90] [--nvdisasm PATH] [--all-paths]
    .venv/bin/python tools/sass_diff.py --normalize LISTING    (an nvdisasm listing, normalized)

For a refactor that must not change the compiled code (no GPU needed to show it): each variant is
compiled alone by nvcc on both sides (so kernels are matched by their name expression even when
a template argument with a default is added), disassembled by nvdisasm, and compared with
addresses, encodings, labels, the kernel's mangled name and spacing left out. Prints one line
per variant (instructions, lines that differ) and exits 1 if any differs. The variants: those
select_variant makes on the mma path (f16/bf16, head dims 32-256, decode and prefill shapes);
--all-paths adds the grouped and rowwise kernels of the same configs and f32/i8. Both sides
take every file of kernels/src (the revision's, and the working tree's) and compile --entry
(attention.hip), so a source split into more headers compiles as its revision had it.

From the kernels package it uses kernels.select.select_variant and a variant's fwd_expr,
macro_options() and path: the options and name expression of the working tree's variant
serve both sides.

nvdisasm ships with the CUDA toolkit; where only nvcc is installed, the pip wheel
nvidia-cuda-nvdisasm has it (`pip download --no-deps nvidia-cuda-nvdisasm`, unzip, bin/nvdisasm).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnconfig import AttentionConfig  # noqa: E402

from kernels.select import Variant, select_variant  # noqa: E402
from kernels.source import SRC_DIR  # noqa: E402


def variants(all_paths: bool) -> list:
    found: dict[str, Variant] = {}
    dtypes = ("f16", "bf16", "f32", "i8") if all_paths else ("f16", "bf16")
    for dtype in dtypes:
        for d in (32, 64, 128, 256):
            for sq, hq, hkv in ((1, 32, 8), (1, 8, 1), (512, 8, 8)):
                c = AttentionConfig(dtype=dtype, g=1, seq_len_q=sq, seq_len_k=4096, num_heads_q=hq,
                                    num_heads_kv=hkv, head_dim_qk=d, head_dim_v=d)
                for mma in (True, False) if all_paths else (True,):
                    v = select_variant(c, mma=mma)
                    if all_paths or v.path == "mma":
                        found.setdefault(v.fwd_expr, v)
    return list(found.values())


def sass(nvcc: str, nvdisasm: str, src_dir: Path, entry: str, v, arch: str, work: Path) -> list[str]:
    """The variant's split kernel as normalized SASS lines."""
    unit = work / f"{abs(hash((str(src_dir), v.fwd_expr)))}.cu"
    unit.write_text(f'#include "{entry}"\nvoid* instance = (void*)&{v.fwd_expr};\n')
    cubin = unit.with_suffix(".cubin")
    subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", f"-I{src_dir}", *v.macro_options(),
                    str(unit), "-o", str(cubin)], check=True, capture_output=True, text=True)
    text = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    return normalize(text)


def normalize(text: str) -> list[str]:
    """Instructions and directives of the split kernel's .text section, without what a rename or
    relink changes: addresses and encodings (/*...*/), labels, the mangled name, spacing."""
    lines, inside = [], False
    for line in text.splitlines():
        section = re.match(r"\s*\.section\s+(\S+)", line)
        if section:
            inside = section.group(1).startswith(".text.") and "attn_splitkv_fwd" in section.group(1)
            continue
        if not inside or re.match(r"\s*\.text\.\S+:", line):
            continue
        line = re.sub(r"/\*[0-9a-fx]+\*/", "", line)
        line = re.sub(r"_Z+\d+attn_splitkv_fwd\w+", "KERNEL", line)
        line = re.sub(r"\.L_x_\d+", "L", line)
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="git revision of the old kernel sources")
    ap.add_argument("--old-dir", type=Path, help="a folder holding the old sources instead of --rev")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvcc", default=shutil.which("nvcc"))
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"))
    ap.add_argument("--all-paths", action="store_true", help="the grouped and rowwise kernels too")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--entry", default="attention.hip", help="the source file that defines the kernels")
    ap.add_argument("--old-entry", help="the old side's, where it differs (default: --entry)")
    ap.add_argument("--normalize", type=Path, metavar="LISTING",
                    help="print an nvdisasm listing's split kernel as compared, and stop")
    a = ap.parse_args()
    if a.normalize:
        sys.stdout.writelines(line + "\n" for line in normalize(a.normalize.read_text()))
        return
    if not a.nvcc or not a.nvdisasm:
        sys.exit("sass_diff: needs nvcc and nvdisasm (--nvcc, --nvdisasm; see the module's docstring)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = a.old_dir
        if old is None:
            old = work / "old"
            old.mkdir()
            paths = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", a.rev, "--",
                                    "kernels/src"], check=True, capture_output=True, text=True).stdout.split()
            for path in paths:
                blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{a.rev}:{path}"],
                                      check=True, capture_output=True).stdout
                dest = old / Path(path).relative_to("kernels/src")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(blob)
        vs = variants(a.all_paths)
        old_entry = a.old_entry or a.entry
        with ThreadPoolExecutor(a.jobs) as pool:
            olds = list(pool.map(lambda v: sass(a.nvcc, a.nvdisasm, old, old_entry, v, a.arch, work), vs))
            news = list(pool.map(lambda v: sass(a.nvcc, a.nvdisasm, SRC_DIR, a.entry, v, a.arch, work), vs))
    changed = 0
    print(f"{a.arch} SASS, {old if a.old_dir else a.rev} against the working tree, {len(vs)} variants")
    for v, o, n in zip(vs, olds, news):
        differ = sum(1 for x, y in zip(o, n) if x != y) + abs(len(o) - len(n))
        changed += differ > 0
        print(f"  {v.fwd_expr:70s} {len(o):6d} -> {len(n):6d} lines, {differ} differ")
    print(f"{changed} of {len(vs)} variants compile to different SASS")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
