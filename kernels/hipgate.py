"""The AMD compile gate: every kernel variant the selector can pick for ROCm, compiled with hipcc
for each of TARGETS, with the options the `hip` backend hands hiprtc (hip_compile_options).

No AMD GPU is needed (`hipcc --genco` only compiles) and nothing is run. One translation unit
per target and option set instantiates every variant's split and combine kernels; the code
object must then hold each of them (their `.kd` kernel descriptors, demangled and compared with
the variants' name expressions), so a kernel the compiler dropped or never instantiated fails.

`python -m kernels.hipgate` (what `make hip-compile` runs) prints targets x variants compiled
and exits 1 on any failure, 2 when hipcc is missing.

`--isa-hashes FILE` also writes a hash of each kernel's and device function's disassembly
(the .text instructions, not the code object: its metadata holds temporary paths) per target
and defect set; `--compare FILE` compiles again and compares with such a file, so a change that
must not alter the generated code (a move, a refactor of the source) shows that it does not:
exit 1 if any function of a build without defects differs. (tools/sass_diff.py does the same for
NVIDIA's SASS on a GPU machine.)

ROCm 5.2's device libraries (Debian's rocm-device-libs) predate gfx1100: for a target the
installed libraries have no ISA-version constant for, the gate generates that one constant
(`__oclc_ISA_version`, the only per-target file of the libraries) beside links to the others.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernels.backends.base import DEFECTS
from kernels.backends.hip import hip_compile_options
from kernels.select import GENERAL_BUCKET, GROUPED_DTYPES, HEAD_DIM_BUCKETS, QK_CPP, Variant
from kernels.source import KernelSource, local_source
from kernels.tuning import GROUPED_MAX_ROWS

TARGETS = ("gfx90a", "gfx1030", "gfx1100")   # MI200 (CDNA2), RDNA2, RDNA3
DEVICE_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/opt/rocm/amdgcn/bitcode")


def rocm_variants(defects: tuple[str, ...] = ()) -> list[Variant]:
    """Every variant select_variant returns without the mma path (NVIDIA only): the rowwise path
    for every dtype and pair of head-dim buckets (the general one included), and the grouped
    path for f16/bf16/f32 with both dims <= 256 and each power-of-two row group it forms."""
    buckets = (*HEAD_DIM_BUCKETS, GENERAL_BUCKET)
    out = [Variant(dt, a, b, defects=defects) for dt in QK_CPP for a in buckets for b in buckets]
    rows = []
    r = 1
    while r <= GROUPED_MAX_ROWS:
        rows.append(r)
        r *= 2
    out += [Variant(dt, a, b, block_m=m, path="grouped", defects=defects)
            for dt in GROUPED_DTYPES for a in HEAD_DIM_BUCKETS for b in HEAD_DIM_BUCKETS for m in rows]
    return out


def hipcc_path() -> str | None:
    return shutil.which("hipcc")


def hipcc_version(hipcc: str) -> str:
    """'HIP version: 5.2.21153-0' and the clang line, from `hipcc --version` on the AMD platform."""
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    out = subprocess.run([hipcc, "--version"], capture_output=True, text=True, env=env).stdout
    keep = [ln.strip() for ln in out.splitlines() if ln.startswith("HIP version") or "clang version" in ln]
    return "; ".join(keep) or out.strip().splitlines()[0]


def _norm(expr: str) -> str:
    """A kernel's template name as demangled and as kernels/select.py writes it, made comparable: the
    bfloat16 type is hip_bfloat16 before ROCm 5.7 and __hip_bfloat16 after."""
    expr = expr.replace(" ", "")
    return re.sub(r"(?<![\w])(__)?hip_bfloat16", "__hip_bfloat16", expr)


def _kernels_in(code_object: bytes) -> set[str]:
    """Template names (up to the argument list) of the kernels whose descriptors the object holds."""
    mangled = sorted(set(m.decode() for m in re.findall(rb"(_Z[A-Za-z0-9_]+)\.kd", code_object)))
    if not mangled:
        return set()
    filt = shutil.which("llvm-cxxfilt-15") or shutil.which("llvm-cxxfilt") or shutil.which("c++filt")
    demangled = subprocess.run([filt], input="\n".join(mangled), capture_output=True, text=True).stdout.splitlines()
    names = set()
    for d in demangled:
        d = d.removeprefix("void ")
        depth = 0
        for i, ch in enumerate(d):   # cut at the '(' that follows the template's closing '>'
            depth += ch == "<"
            depth -= ch == ">"
            if ch == "(" and depth == 0:
                d = d[:i]
                break
        names.add(_norm(d))
    return names


def _device_lib_dir(target: str, work: Path) -> Path | None:
    """None where the installed device libraries know `target`; else a directory of links to them
    plus a generated oclc_isa_version_<n>.bc for it."""
    installed = next((Path(d) for d in DEVICE_LIB_DIRS if Path(d).is_dir()), None)
    num = target.removeprefix("gfx")
    if installed is None or (installed / f"oclc_isa_version_{num}.bc").exists():
        return None
    llvm_as = shutil.which("llvm-as-15") or shutil.which("llvm-as")
    if llvm_as is None:
        raise RuntimeError(f"{target}: the device libraries lack oclc_isa_version_{num}.bc and no llvm-as builds it")
    d = work / f"devlibs-{target}"
    d.mkdir()
    for bc in installed.glob("*.bc"):
        (d / bc.name).symlink_to(bc)
    version = int(num[:-2]) * 1000 + int(num[-2], 16) * 100 + int(num[-1], 16)   # gfx1100 -> 11000
    ll = d / "isa.ll"
    ll.write_text('target triple = "amdgcn-amd-amdhsa"\n'
                  f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 {version}, align 4\n")
    subprocess.run([llvm_as, str(ll), "-o", str(d / f"oclc_isa_version_{num}.bc")], check=True)
    return d


@dataclass
class UnitResult:
    target: str
    options: list[str]
    variants: list[Variant]
    ok: bool
    seconds: float
    missing: list[str] = field(default_factory=list)
    log: str = ""
    isa: dict[str, str] = field(default_factory=dict)   # demangled function -> disassembly hash


def _llvm_tool(name: str) -> str | None:
    for d in ("/usr/lib/llvm-15/bin", "/opt/rocm/llvm/bin"):
        if Path(d, name).is_file():
            return str(Path(d, name))
    return shutil.which(f"{name}-15") or shutil.which(name)


def isa_hashes(code_object: Path, target: str) -> dict[str, str]:
    """sha256 (16 hex digits) of each function's instructions in `code_object` (hipcc --genco's
    offload bundle), keyed by demangled name. Addresses, encodings and the padding after a
    function are left out: they move when another function of the object changes size."""
    bundler, objdump = _llvm_tool("clang-offload-bundler"), _llvm_tool("llvm-objdump")
    if bundler is None or objdump is None:
        raise RuntimeError("--isa-hashes needs clang-offload-bundler and llvm-objdump (LLVM 15, as hipcc uses)")
    elf = code_object.with_suffix(".elf")
    subprocess.run([bundler, "--unbundle", "--type=o", f"--input={code_object}",
                    f"--targets=hipv4-amdgcn-amd-amdhsa--{target}", f"--output={elf}"], check=True)
    text = subprocess.run([objdump, "-d", "-C", str(elf)], capture_output=True, text=True, check=True).stdout
    funcs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = re.match(r"(?:[0-9a-f]+ )?<(.+)>:$", line)
        if header:
            name = header.group(1)
            current = None if name == ".text" else funcs.setdefault(_norm(name), [])
        elif current is not None:
            insn = line.split("//", 1)[0].strip()
            if insn and insn != "...":
                current.append(insn)
    out = {}
    for name, insns in funcs.items():
        while insns and insns[-1].startswith("s_nop"):   # alignment padding
            insns.pop()
        out[name] = hashlib.sha256("\n".join(insns).encode()).hexdigest()[:16]
    return out


def _compile_unit(hipcc: str, src_dir: Path, work: Path, target: str, variants: list[Variant],
                  devlibs: Path | None, tag: str, isa: bool = False) -> UnitResult:
    options = hip_compile_options(target, variants[0])
    assert all(hip_compile_options(target, v) == options for v in variants)
    exprs = sorted({e for v in variants for e in v.name_expressions})
    tu = work / f"gate-{target}-{tag}.hip"
    tu.write_text('#include "attention.hip"\n'
                  "// Host references instantiate each kernel for the device too.\n"
                  "__attribute__((used)) static const void* attn_gate_kernels[] = {\n"
                  + "".join(f"    (const void*)&{e},\n" for e in exprs) + "};\n")
    out = tu.with_suffix(".co")
    cmd = [hipcc, *options, "--genco", "-I", str(src_dir), str(tu), "-o", str(out)]
    if devlibs is not None:
        cmd.insert(1, f"--rocm-device-lib-path={devlibs}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})
    secs = time.perf_counter() - t0
    if proc.returncode:
        return UnitResult(target, options, variants, False, secs, log=proc.stderr[-4000:])
    found = _kernels_in(out.read_bytes())
    missing = [e for e in exprs if _norm(e) not in found]
    hashes = isa_hashes(out, target) if isa and not missing else {}
    return UnitResult(target, options, variants, not missing, secs, missing, proc.stderr[-2000:], hashes)


@dataclass
class GateReport:
    hipcc: str
    version: str
    units: list[UnitResult]
    seconds: float
    generated_isa: tuple[str, ...] = ()   # targets the installed device libraries lack (see above)

    @property
    def ok(self) -> bool:
        return all(u.ok for u in self.units)

    def isa(self) -> dict[str, dict[str, str]]:
        """'<target> <defects or clean>' -> demangled function -> disassembly hash (--isa-hashes).
        A function several units instantiate (the combine kernel) hashes alike in each, or the
        entry lists every hash seen, sorted."""
        seen: dict[str, dict[str, set[str]]] = {}
        for u in self.units:
            key = f"{u.target} {'-'.join(u.variants[0].defects) or 'clean'}"
            for name, h in u.isa.items():
                seen.setdefault(key, {}).setdefault(name, set()).add(h)
        return {k: {n: ",".join(sorted(hs)) for n, hs in sorted(fs.items())} for k, fs in sorted(seen.items())}

    def compiled(self) -> dict[str, dict[str, list[str]]]:
        """target -> variant name -> the options it was compiled with."""
        out: dict[str, dict[str, list[str]]] = {}
        for u in self.units:
            if u.ok:
                for v in u.variants:
                    out.setdefault(u.target, {})[v.name] = u.options
        return out


def default_defect_sets() -> list[tuple[str, ...]]:
    """No defect, and each defect alone (what `--defect NAME` builds): every switch compiles."""
    return [(), *((d,) for d in sorted(DEFECTS))]


def defect_representatives(defects: tuple[str, ...]) -> list[Variant]:
    """The variants a defect switch is compiled into by the gate: each path and dtype once, and
    the general (runtime head dims) bucket. A switch changes a few lines that every variant of a
    path shares, and all 244 variants x 8 switches x 3 targets would take an hour of hipcc."""
    out = [Variant(dt, 128, 128, defects=defects) for dt in QK_CPP]
    out.append(Variant("f16", GENERAL_BUCKET, GENERAL_BUCKET, defects=defects))
    out += [Variant(dt, 128, 128, block_m=GROUPED_MAX_ROWS, path="grouped", defects=defects) for dt in GROUPED_DTYPES]
    return out


CHUNK = 64   # variants a translation unit instantiates (smaller units spread over the cores)


def run_gate(targets: tuple[str, ...] = TARGETS, defect_sets: list[tuple[str, ...]] | None = None,
             source: KernelSource | None = None, jobs: int | None = None,
             variants: list[Variant] | None = None, isa: bool = False) -> GateReport:
    """Compile for `targets` every option set of `defect_sets` (default: none, then each defect
    alone); `variants` replaces the variant list of every set (tests). `isa`: hash each
    function's disassembly too (GateReport.isa)."""
    hipcc = hipcc_path()
    if hipcc is None:
        raise FileNotFoundError("hipcc not found (Debian: apt-get install hipcc libamdhip64-dev)")
    source = source or local_source()
    defect_sets = default_defect_sets() if defect_sets is None else defect_sets
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attn-hipgate-") as tmp:
        work = Path(tmp)
        src_dir = work / "src"
        src_dir.mkdir()
        for name, text in source.files.items():
            (src_dir / name).write_text(text)
        devlibs = {t: _device_lib_dir(t, work) for t in targets}
        jobs_list = []
        for t in targets:
            for ds in defect_sets:
                if variants is not None:
                    chosen = [replace(v, defects=ds) for v in variants]
                else:
                    chosen = rocm_variants() if not ds else defect_representatives(ds)
                for i in range(0, len(chosen), CHUNK):
                    jobs_list.append((t, chosen[i:i + CHUNK], f"{'-'.join(ds) or 'clean'}-{i // CHUNK}"))
        jobs_list.sort(key=lambda j: -len(j[1]))   # the long units first
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            units = list(pool.map(lambda j: _compile_unit(hipcc, src_dir, work, j[0], j[1], devlibs[j[0]], j[2], isa),
                                  jobs_list))
    return GateReport(hipcc, hipcc_version(hipcc), units, time.perf_counter() - t0,
                      tuple(t for t, d in devlibs.items() if d is not None))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.hipgate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--no-defects", action="store_true", help="only the variants without a defect switch")
    ap.add_argument("--jobs", type=int, default=None, help="hipcc processes at once (default: cores)")
    ap.add_argument("--isa-hashes", metavar="FILE", help="write each function's disassembly hash (JSON)")
    ap.add_argument("--compare", metavar="FILE", help="compare the disassembly hashes with FILE (--isa-hashes)")
    args = ap.parse_args(argv)
    if hipcc_path() is None:
        print("hip-compile: hipcc not found (Debian: apt-get install hipcc libamdhip64-dev)", file=sys.stderr)
        return 2
    targets = tuple(t for t in args.targets.split(",") if t)
    want_isa = bool(args.isa_hashes or args.compare)
    report = run_gate(targets, [()] if args.no_defects else None, jobs=args.jobs, isa=want_isa)
    print(f"hip-compile: {report.hipcc} ({report.version})")
    if report.generated_isa:
        print(f"  {', '.join(report.generated_isa)}: not in the installed device libraries; "
              "their ISA-version constant generated, the other libraries as installed")
    per_target: dict[str, list[UnitResult]] = {}
    for u in report.units:
        per_target.setdefault(u.target, []).append(u)
    for target, units in per_target.items():
        clean = sum(len(u.variants) for u in units if u.ok and not u.variants[0].defects)
        switched = sum(len(u.variants) for u in units if u.ok and u.variants[0].defects)
        n_all = sum(len(u.variants) for u in units)
        print(f"  {target}: {clean + switched}/{n_all} compiled: {clean} variants without defects, "
              f"{switched} with one defect switch ({sum(u.seconds for u in units):.0f} s of hipcc)")
        for u in units:
            if not u.ok:
                print(f"    FAILED {' '.join(u.options)}: "
                      + (f"kernels missing: {u.missing[:3]}" if u.missing else u.log.strip()[-1500:]))
    total = sum(len(u.variants) for u in report.units if u.ok)
    print(f"hip-compile: {'ok' if report.ok else 'FAILED'}: {len(per_target)} targets x "
          f"{len(rocm_variants())} variants (+ {len(defect_representatives(('hang',)))} per defect switch), "
          f"{total} compiled, {report.seconds:.0f} s")
    if not report.ok:
        return 1
    isa = report.isa() if want_isa else {}
    if args.isa_hashes:
        Path(args.isa_hashes).write_text(json.dumps(isa, indent=1, sort_keys=True) + "\n")
        print(f"isa: {sum(map(len, isa.values()))} function hashes written to {args.isa_hashes}")
    if args.compare:
        return 0 if print_isa_comparison(json.loads(Path(args.compare).read_text()), isa) else 1
    return 0


def compare_isa(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Per build ('<target> <defects>') of both: the functions whose hash changed, appeared or went."""
    out = {}
    for build in sorted(set(before) & set(after)):
        b, a = before[build], after[build]
        diff = [f"changed {n}" for n in sorted(set(a) & set(b)) if a[n] != b[n]]
        diff += [f"new {n}" for n in sorted(set(a) - set(b))] + [f"gone {n}" for n in sorted(set(b) - set(a))]
        out[build] = diff
    return out


def print_isa_comparison(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> bool:
    """Print the comparison; True when every build without defects is identical."""
    diffs = compare_isa(before, after)
    ok = True
    for build, diff in diffs.items():
        n = len(after[build])
        print(f"  isa {build}: " + ("identical" if not diff else f"{len(diff)} of {n} functions differ")
              + f" ({n} functions)")
        for d in diff[:20]:
            print(f"    {d}")
        ok &= not diff or not build.endswith(" clean")
    only = sorted(set(before) ^ set(after))
    if only:
        print(f"  isa: builds in one file only: {', '.join(only)}")
    print(f"isa: {'default builds identical' if ok else 'DEFAULT BUILDS DIFFER'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
