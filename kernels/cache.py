"""The on-disk compile cache of kernel binaries, safe for many concurrent worker processes.

A binary is stored under `<dir>/<variant name>-<key>.bin`, where the key hashes everything the
binary depends on: the variant name (all compile-time parameters), the kernel source hash, the
compiler options, the architecture and the compiler version. A lookup goes

    read -> (miss) file lock -> read again -> compile -> write tmp + os.replace -> return

so concurrent workers never compile one variant twice and never read a half-written file. A
file that does not parse (truncated by a crash outside this protocol, say) is a miss and is
rewritten.

The compiler is injected (`compile_fn`), so the cache works, and is tested, without any GPU
runtime. Compile failures and time-outs raise `CompileError` with the compiler's log; they are
never cached.

Settings (settings/, read when a KernelCache is made, never at import time):
  kernel_cache          (ATTNSWEEP_KERNEL_CACHE) the cache directory
  kernel_cache_disable  (ATTNSWEEP_KERNEL_CACHE_DISABLE) no disk cache and no in-process reuse:
                        every prepare compiles (bench/sweep.py's cold run measures compile times)
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from filelock import FileLock, Timeout

from settings import get_settings
from kernels.errors import CompileError

MAGIC = b"ATTNSWEEP-KCACHE-1\n"
DEFAULT_COMPILE_TIMEOUT_S = 300.0


def default_cache_dir() -> Path:
    return Path(get_settings().kernel_cache).expanduser()


def cache_disabled() -> bool:
    return get_settings().kernel_cache_disable


@dataclass(frozen=True)
class Compiled:
    """What a compiler produced: the binary and name expression -> lowered name."""

    binary: bytes
    lowered_names: dict[str, str]
    log: str = ""


def cache_key(fields: Mapping[str, Any]) -> str:
    """A short stable hash of the key fields (canonical JSON)."""
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class CacheResult:
    compiled: Any          # whatever compile_fn returned (Compiled)
    hit: bool
    compile_s: float       # time spent compiling (0 on a hit)
    path: Path | None


def _encode(compiled: Any, fields: Mapping[str, Any]) -> bytes:
    meta = json.dumps({"fields": dict(fields), "lowered_names": compiled.lowered_names,
                       "log": compiled.log}, sort_keys=True).encode()
    return MAGIC + struct.pack("<QQ", len(meta), len(compiled.binary)) + meta + compiled.binary


def _decode(blob: bytes, fields: Mapping[str, Any]) -> Compiled | None:
    head = len(MAGIC) + 16
    if len(blob) < head or not blob.startswith(MAGIC):
        return None
    meta_len, bin_len = struct.unpack("<QQ", blob[len(MAGIC):head])
    if len(blob) != head + meta_len + bin_len:
        return None
    try:
        meta = json.loads(blob[head:head + meta_len])
    except ValueError:
        return None
    if meta.get("fields") != json.loads(json.dumps(dict(fields), default=str)):
        return None  # a hash collision or a foreign file: never load it
    return Compiled(binary=blob[head + meta_len:], lowered_names=meta["lowered_names"], log=meta.get("log", ""))


def run_with_timeout(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Run fn in a daemon thread; CompileError(timed_out=True) if it outlives timeout_s.

    (An in-process compiler cannot be interrupted: the thread is abandoned, not killed.)"""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name=f"compile-{what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise CompileError(f"compiling {what} timed out after {timeout_s:g} s", log="", timed_out=True)
    if "error" in box:
        raise box["error"]
    return box["value"]


class KernelCache:
    """Disk cache of compiled variants. `enabled=False` compiles every time and stores nothing."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, enabled: bool | None = None,
                 compile_timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S, lock_timeout_s: float | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
        self.enabled = (not cache_disabled()) if enabled is None else bool(enabled)
        self.compile_timeout_s = compile_timeout_s
        self.lock_timeout_s = lock_timeout_s if lock_timeout_s is not None else compile_timeout_s + 60.0

    def path_for(self, variant_name: str, fields: Mapping[str, Any]) -> Path:
        return self.directory / f"{variant_name}-{cache_key(fields)}.bin"

    def _read(self, path: Path, fields: Mapping[str, Any]) -> Any | None:
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        return _decode(blob, fields)

    def _compile(self, variant_name: str, compile_fn: Callable[[], Any]) -> tuple[Any, float]:
        t0 = time.perf_counter()
        compiled = run_with_timeout(compile_fn, self.compile_timeout_s, variant_name)
        return compiled, time.perf_counter() - t0

    def load_or_compile(self, variant_name: str, fields: Mapping[str, Any],
                        compile_fn: Callable[[], Any]) -> CacheResult:
        if not self.enabled:
            compiled, secs = self._compile(variant_name, compile_fn)
            return CacheResult(compiled, False, secs, None)

        path = self.path_for(variant_name, fields)
        compiled = self._read(path, fields)
        if compiled is not None:
            return CacheResult(compiled, True, 0.0, path)

        self.directory.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock", timeout=self.lock_timeout_s)
        try:
            with lock:
                compiled = self._read(path, fields)   # another process may have compiled it
                if compiled is not None:
                    return CacheResult(compiled, True, 0.0, path)
                compiled, secs = self._compile(variant_name, compile_fn)
                self._write_atomic(path, _encode(compiled, fields))
                return CacheResult(compiled, False, secs, path)
        except Timeout:
            raise CompileError(f"waited {self.lock_timeout_s:g} s for another process compiling "
                               f"{variant_name} (lock {path}.lock)", timed_out=True) from None

    @staticmethod
    def _write_atomic(path: Path, blob: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def clear(self) -> int:
        """Remove every cached binary; returns how many."""
        n = 0
        if self.directory.is_dir():
            for p in self.directory.glob("*.bin"):
                p.unlink(missing_ok=True)
                n += 1
        return n
