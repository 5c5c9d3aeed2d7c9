"""The inputs' standard normals (docs/spec.md §1: numpy.random.default_rng(data_seed)'s), drawn
straight into their storage type.

numpy's Generator's normals are most of a config's input time, and the spec fixes their values
bit for bit. normals.c steps the same PCG64 in registers and takes the same ziggurat's fast path
(the sign as a bit, not a branch that mispredicts every other draw), and rounds each value once
to the storage type in the same loop, with no float64 temporary (what each costs:
docs/decisions.md, "The inputs' normal draws"). The draws off the fast path (about one in a
hundred) are numpy's own random_standard_normal (its C API, numpy/random/lib/libnpyrandom.a) run
on the same state, and the fast path's tables are read out of that function at load, so nothing
of numpy's code or tables is copied.

The loop is compiled on first use with the host's C compiler ($CC, cc, gcc or clang) into
`kernel_cache/host/` and used only after it drew numpy's own bits on a check of every dtype at
load. Without a compiler, numpy's static library or its headers, with a failed check, with a
generator other than PCG64 or with ATTNSWEEP_NATIVE_NORMALS=0, numpy's Generator draws them
(a cache-sized float64 chunk at a time) and rounding.narrow_f64 narrows them: the same bytes.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import ml_dtypes
import numpy as np

from reference.chunks import Workspace
from reference.rounding import narrow_f64

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("normals.c")
# -ffp-contract=off: no fused multiply-add, whatever the target's default (aarch64 fuses).
CFLAGS = ("-O2", "-std=c11", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off")
_KINDS = {np.dtype(np.float64): 0, np.dtype(np.float32): 1, np.dtype(np.float16): 2, np.dtype(ml_dtypes.bfloat16): 3}
_NORMAL_CHUNK = 1 << 16   # the fallback's float64 draws at a time (512 KiB, near the caches)
_CHECK_SEEDS = (20240611, 7)
_CHECK_SIZE = 1 << 17     # about 35 tail draws and a thousand wedge draws a seed
_MASK64 = (1 << 64) - 1


def kinds() -> tuple[np.dtype, ...]:
    """The dtypes draw_normals fills."""
    return tuple(_KINDS)


def draw_normals(rng: np.random.Generator, out: np.ndarray, work: Workspace | None = None) -> np.ndarray:
    """Fill the contiguous `out` with rng's next out.size standard normals, each rounded once to
    out's dtype (float64, float32, float16 or bfloat16): out[...] = rng.standard_normal(out.shape)
    cast, bit for bit, and rng left where that draw leaves it. `work`: the fallback's scratch."""
    kind = _KINDS.get(out.dtype)
    if kind is None:
        raise ValueError(f"draw_normals: dtype {out.dtype} is not one of {', '.join(str(d) for d in _KINDS)}")
    if not out.flags.c_contiguous:
        raise ValueError("draw_normals: out must be contiguous")
    lib = native()
    if lib is not None and type(rng.bit_generator) is np.random.PCG64:
        _native_draw(lib, rng, out, kind)
        return out
    return _numpy_draw(rng, out, work or Workspace())


def narrow(x: np.ndarray, out: np.ndarray, work: Workspace | None = None) -> np.ndarray:
    """out[...] = x for a 1-d contiguous float64 x, rounded once (rounding.narrow_f64's values), by
    the compiled loop where there is one and x is finite."""
    kind = _KINDS.get(out.dtype)
    lib = native()
    if (lib is not None and kind is not None and x.dtype == np.float64 and x.ndim == 1 and out.shape == x.shape
            and x.flags.c_contiguous and out.flags.c_contiguous):
        if lib.attn_narrow(x.ctypes.data, x.size, out.ctypes.data, kind) == 0:
            return out
    return narrow_f64(x, out, None, work)


def _numpy_draw(rng: np.random.Generator, out: np.ndarray, work: Workspace) -> np.ndarray:
    # A cache-sized chunk at a time: the same values as one standard_normal(shape) (the
    # generator fills sequentially), without a float64 temporary of the whole tensor.
    flat = out.reshape(-1)
    buf = work.take("normals", (min(flat.size, _NORMAL_CHUNK),), np.float64)
    scratch = work.take("narrow_f32", buf.shape, np.float32)
    for i in range(0, flat.size, _NORMAL_CHUNK):
        part = buf[:min(_NORMAL_CHUNK, flat.size - i)]
        rng.standard_normal(out=part)
        narrow_f64(part, flat[i:i + len(part)], scratch[:len(part)], work)
    return out


def _native_draw(lib: ctypes.CDLL, rng: np.random.Generator, out: np.ndarray, kind: int) -> None:
    bitgen = rng.bit_generator
    with bitgen.lock:
        state = bitgen.state   # has_uint32 and uinteger (the buffered half of a 32-bit draw) stay
        s, inc = state["state"]["state"], state["state"]["inc"]
        words = np.array([s >> 64, s & _MASK64, inc >> 64, inc & _MASK64], dtype=np.uint64)
        if lib.attn_normals(words.ctypes.data, out.size, out.ctypes.data, kind) != 0:
            raise RuntimeError("normals.c refused a draw it was checked for")
        state["state"]["state"] = (int(words[0]) << 64) | int(words[1])
        bitgen.state = state


@lru_cache(maxsize=1)
def native() -> ctypes.CDLL | None:
    """The compiled loop, built and checked once a process; None where numpy draws instead."""
    from settings import Settings

    settings = Settings()   # not get_settings' cache: a pool process reads the environment it has
    if not settings.native_normals:
        return None
    try:
        lib = _load(settings.kernel_cache / "host")
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("normal draws by numpy: the compiled loop is not available (%s)", exc)
        return None
    if lib is None:
        return None
    if not _agrees(lib):
        log.warning("normal draws by numpy: the compiled loop (%s) differs from numpy %s", SOURCE.name, np.__version__)
        return None
    return lib


def _numpy_parts() -> tuple[Path, Path] | None:
    """numpy's C API for numpy.random: (include folder, libnpyrandom.a), or None."""
    include = Path(np.get_include())
    static = Path(np.random.__file__).parent / "lib" / "libnpyrandom.a"
    if not (include / "numpy" / "random" / "bitgen.h").is_file() or not static.is_file():
        return None
    return include, static


def _compiler() -> str | None:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def _load(folder: Path) -> ctypes.CDLL | None:
    parts, cc = _numpy_parts(), _compiler()
    if parts is None or cc is None:
        log.info("normal draws by numpy: %s", "no C compiler" if cc is None else "numpy has no libnpyrandom.a")
        return None
    include, static = parts
    key = hashlib.sha256()
    for item in (SOURCE.read_bytes(), static.read_bytes(), cc.encode(), " ".join(CFLAGS).encode(),
                 np.__version__.encode(), sys.platform.encode(), platform.machine().encode()):
        key.update(item + b"\0")
    path = folder / f"normals-{key.hexdigest()[:20]}.so"
    if not path.is_file():
        from filelock import FileLock

        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / "normals.lock"), timeout=120):
            if not path.is_file():   # another process built it while this one waited
                _build(cc, include, static, folder, path)
    lib = ctypes.CDLL(str(path))
    for name in ("attn_normals", "attn_narrow"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
        fn.restype = ctypes.c_int
    lib.attn_normals_init.restype = ctypes.c_int
    if lib.attn_normals_init() != 0:
        log.warning("normal draws by numpy: numpy %s's random_standard_normal is not the ziggurat normals.c reads", np.__version__)
        return None
    return lib


def _build(cc: str, include: Path, static: Path, folder: Path, path: Path) -> None:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        built = Path(tmp) / path.name
        cmd = [cc, *CFLAGS, f"-I{include}", str(SOURCE), str(static), "-lm", "-o", str(built)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(built, path)   # whole or absent, for the other processes of the host


def _agrees(lib: ctypes.CDLL) -> bool:
    """Whether the loop draws numpy's bits in every dtype and leaves the generator where numpy does."""
    for seed in _CHECK_SEEDS:
        numpy_rng, ours = np.random.default_rng(seed), np.random.default_rng(seed)
        want = numpy_rng.standard_normal(_CHECK_SIZE)
        for dtype, kind in _KINDS.items():
            expected = narrow_f64(want, np.empty(want.shape, dtype))
            got = np.empty(want.shape, dtype)
            fresh = np.random.default_rng(seed)
            _native_draw(lib, fresh, got, kind)
            narrowed = np.empty(want.shape, dtype)
            if (lib.attn_narrow(want.ctypes.data, want.size, narrowed.ctypes.data, kind) != 0
                    or got.tobytes() != expected.tobytes() or narrowed.tobytes() != expected.tobytes()):
                return False
        _native_draw(lib, ours, np.empty(_CHECK_SIZE), 0)
        if ours.bit_generator.state != numpy_rng.bit_generator.state:
            return False
    return True
