"""A bounded on-disk cache of a config's inputs and host references, shared by a host's workers.

A repeated sweep of the same configs (CI on every push, triage reruns) draws the same inputs
and computes the same float64-derived reference every time: both are pure functions of the
config (its data_seed and data_regime included), the split size block_n the kernel ran at, and
the code of reference/ and attnconfig/ with numpy's and ml_dtypes' versions (REFERENCE_VERSION).
So an entry is addressed by those, and a hit returns the same bytes the computation would.

One file an entry, `<dir>/<sha256 of the key>-<kind>.entry`:

    MAGIC | header length (u64) | header JSON (the key, array names, dtypes, shapes, offsets)
    | arrays, each 64-byte aligned | sha256 of all of the above

- A write goes to a temporary file in the folder, then os.replace: a reader sees a whole entry
  or none, and two processes writing one key leave one of their (equal) entries.
- A file that is short, fails its digest or names another key is a miss (and is removed); a
  cache entry never decides a verdict the computation would not have.
- The folder is kept under `max_bytes`. Entries unused for IDLE_S (by mtime; a hit touches
  its entry) go first, oldest first: other code's references, other sweeps' configs. Then the
  largest go, and an entry larger than every one it would displace is not stored. Not least
  recently used alone: a sweep runs its costliest configs first, so the second run of a
  sweep larger than the bound would evict, config by config, the entries it is about to read
  (the cache would hold the smallest configs of no use to it); by size, a repeated sweep keeps
  hitting on every config that fits, the most configs a byte. An entry larger than
  max_bytes / ENTRY_SHARE is never stored.
- The split partials of the reference are stored without their trailing splits that no key
  reached (O = 0, LSE = -inf bit for bit): a config of 128 splits over a few blocks keeps one.

Settings (settings/, read by `from_settings`): data_cache (ATTNSWEEP_DATA_CACHE) the folder,
data_cache_bytes (ATTNSWEEP_DATA_CACHE_BYTES) its bound. No folder, no cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from attnconfig import AttentionConfig
from reference import attention_lowprec, attention_splitkv, make_inputs
from reference.splitkv import RowScales, SplitKVResult

MAGIC = b"ATTNDC1\n"
FORMAT = 1
ALIGN = 64
DIGEST = 32
ENTRY_SHARE = 8          # an entry may take at most this share of the bound
IDLE_S = 6 * 3600.0      # an entry unused this long is the first to go
# A process counts the folder's bytes by a scan at most this often, adding what it wrote since:
# a scan stats every entry (a few thousand for a sweep), too slow to repeat for every write.
SCAN_S = 2.0
STALE_TMP_S = 3600.0     # a temporary file this old belongs to a writer that died
_DTYPES = {np.dtype(t).name: np.dtype(t)
           for t in (np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.bool_, ml_dtypes.bfloat16)}
_NEG_INF_F32 = np.array(-np.inf, dtype=np.float32).view(np.uint32)


@lru_cache(maxsize=1)
def reference_version() -> str:
    """The code a cached entry depends on: reference/ and attnconfig/ sources (reference/normals.c
    included), numpy, ml_dtypes."""
    import attnconfig
    import reference

    digest = hashlib.sha256(f"numpy {np.__version__} ml_dtypes {ml_dtypes.__version__}\n".encode())
    for package in (reference, attnconfig):
        folder = Path(package.__file__).parent
        for path in sorted([*folder.glob("*.py"), *folder.glob("*.c")]):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def compute_reference(config: AttentionConfig, inputs: Mapping[str, Any], block_n: int) -> tuple[SplitKVResult, np.ndarray]:
    """The definition: the split-KV reference with its |V| row scales, and the low-precision
    output err_ratio reads (float32-held), as sweeps.runner judges a config by."""
    ref = attention_splitkv(config, inputs, block_n=block_n, magnitude=True)
    return ref, attention_lowprec(config, inputs, as_float32=True)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    stored: int = 0
    skipped_large: int = 0


@dataclass
class DataCache:
    folder: Path
    max_bytes: int
    #: the largest entry stored; None: max_bytes / ENTRY_SHARE
    max_entry_bytes: int | None = None
    #: how stale this process's count of the folder may be (other processes' writes and touches)
    scan_s: float = SCAN_S
    stats: CacheStats = field(default_factory=CacheStats)
    # (when scanned, entries, bytes): the last scan with this process's writes and removals since
    _snap: tuple[float, list[tuple[float, int, str]], int] | None = field(default=None, repr=False)
    _written: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder).expanduser()
        if self.max_entry_bytes is None:
            self.max_entry_bytes = self.max_bytes // ENTRY_SHARE
        self.folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(cls, settings: Any = None) -> "DataCache | None":
        """The host's cache as the settings name it; None where it is off."""
        if settings is None:
            from settings import Settings

            settings = Settings()   # not get_settings' cache: the environment may have changed
        if settings.data_cache is None:
            return None
        return cls(Path(settings.data_cache), settings.data_cache_bytes)

    # --- what the runner asks for ----------------------------------------------------------------
    def inputs(self, config: AttentionConfig) -> tuple[dict[str, Any], bool]:
        """make_inputs(config), from the cache where it holds them; (inputs, hit)."""
        key = _key(config, "inputs")
        found = self._get(key)
        if found is not None:
            arrays, meta = found
            out: dict[str, Any] = dict(arrays)
            out.update(meta["scalars"])
            for array in arrays.values():
                array.flags.writeable = False
            return out, True
        inputs = make_inputs(config)
        arrays = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in inputs.items() if not isinstance(v, np.ndarray)}
        self._put(key, arrays, {"scalars": scalars})
        return inputs, False

    def reference(self, config: AttentionConfig, inputs: Mapping[str, Any],
                  block_n: int) -> tuple[SplitKVResult, np.ndarray, bool]:
        """compute_reference(config, inputs, block_n), from the cache where it holds it;
        `inputs` must be make_inputs(config). (reference, low, hit)."""
        key = _key(config, "reference", block_n)
        found = self._get(key)
        if found is not None:
            ref, low = _unpack_reference(*found)
            return ref, low, True
        ref, low = compute_reference(config, inputs, block_n)
        self._put(key, *_pack_reference(ref, low))
        return ref, low, False

    # --- entries ---------------------------------------------------------------------------------
    def path(self, key: dict[str, Any]) -> Path:
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:40]
        return self.folder / f"{name}-{key['kind']}.entry"

    def _get(self, key: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = bytearray(size)
                got = f.readinto(buf)
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError:
            self.stats.misses += 1
            return None
        entry = _parse(buf, got, key)
        if entry is None:
            self.stats.misses += 1
            self.stats.corrupt += 1
            _unlink(path)
            return None
        _touch(path)   # recently used: the last to be evicted
        self.stats.hits += 1
        return entry

    def _put(self, key: dict[str, Any], arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        try:
            header, total = _layout(key, arrays, meta)
        except (KeyError, TypeError, ValueError):   # a dtype or value the format does not hold
            return
        if total > self.max_entry_bytes or not self._fits(total):
            self.stats.skipped_large += 1
            return
        self._written += 1
        tmp = str(self.folder / f".{os.getpid()}-{self._written}-{os.urandom(4).hex()}.tmp")
        try:
            with open(tmp, "xb") as f:
                digest = hashlib.sha256()
                for chunk in _chunks(header, arrays):
                    digest.update(chunk)
                    f.write(chunk)
                f.write(digest.digest())
            _touch(Path(tmp))
            os.replace(tmp, self.path(key))
        except OSError:   # a full disk or a removed folder: the entry is not stored, nothing else
            _unlink(Path(tmp))
            return
        self.stats.stored += 1
        entries, held = self._entries()
        entries.append((time.time(), total, str(self.path(key))))
        self._snap = (self._snap[0], entries, held + total)
        if held + total > self.max_bytes:
            self.evict()

    def _fits(self, size: int) -> bool:
        """Whether an entry of `size` bytes may go in: there is room, or there would be after
        the idle entries and larger ones than it went."""
        entries, held = self._entries()
        if held + size <= self.max_bytes:
            return True
        now = time.time()
        return any(now - mtime > IDLE_S or entry_size > size for mtime, entry_size, _ in entries)

    def evict(self) -> int:
        """Remove entries until the folder fits max_bytes (idle ones oldest first, then the
        largest); the bytes kept."""
        entries, total = self._entries(fresh=True)
        if total <= self.max_bytes:
            return total
        now = time.time()
        idle = sorted(e for e in entries if now - e[0] > IDLE_S)
        used = sorted((e for e in entries if now - e[0] <= IDLE_S), key=lambda e: -e[1])
        gone = set()
        for _mtime, size, path in idle + used:
            if total <= self.max_bytes:
                break
            _unlink(Path(path))
            gone.add(path)
            total -= size
        self._snap = (self._snap[0], [e for e in entries if e[2] not in gone], total)
        return total

    def _entries(self, fresh: bool = False) -> tuple[list[tuple[float, int, str]], int]:
        """(mtime, size, path) of every entry and their total: a scan of the folder, or the last
        scan's (younger than SCAN_S) with what this process wrote and removed since."""
        now = time.time()
        if fresh or self._snap is None or now - self._snap[0] > self.scan_s:
            self._snap = (now, *self._scan(now))
        return list(self._snap[1]), self._snap[2]

    def _scan(self, now: float) -> tuple[list[tuple[float, int, str]], int]:
        """(mtime, size, path) of every entry and their total; stale temporary files removed."""
        entries, total = [], 0
        try:
            scan = list(os.scandir(self.folder))
        except OSError:
            return [], 0
        for item in scan:
            try:
                st = item.stat()
            except OSError:
                continue
            if item.name.endswith(".entry"):
                entries.append((st.st_mtime, st.st_size, item.path))
                total += st.st_size
            elif item.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                _unlink(Path(item.path))
        return entries, total


def _key(config: AttentionConfig, kind: str, block_n: int | None = None) -> dict[str, Any]:
    key = {"format": FORMAT, "kind": kind, "config": config.content_hash(), "data_seed": config.data_seed,
           "data_regime": config.data_regime, "reference": reference_version()}
    if block_n is not None:
        key["block_n"] = int(block_n)
    return key


def _layout(key: dict[str, Any], arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[bytes, int]:
    specs, offset = [], 0
    for name, array in arrays.items():
        dtype = _DTYPES[array.dtype.name]
        offset = -(-offset // ALIGN) * ALIGN
        specs.append({"name": name, "dtype": dtype.name, "shape": list(array.shape), "offset": offset})
        offset += array.nbytes
    doc = json.dumps({"key": key, "meta": meta, "arrays": specs, "payload": offset}, sort_keys=True).encode()
    start = -(-(len(MAGIC) + 8 + len(doc)) // ALIGN) * ALIGN
    header = MAGIC + struct.pack("<Q", len(doc)) + doc
    header += b"\0" * (start - len(header))
    return header, start + offset + DIGEST


def _chunks(header: bytes, arrays: dict[str, np.ndarray]):
    yield header
    written = 0
    for array in arrays.values():
        pad = -written % ALIGN
        if pad:
            yield b"\0" * pad
            written += pad
        data = np.ascontiguousarray(array)
        yield memoryview(data.reshape(-1).view(np.uint8)) if data.size else b""
        written += data.nbytes


def _parse(buf: bytearray, got: int, key: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays (views of buf) and meta of a whole, untampered entry of `key`; else None."""
    head = len(MAGIC) + 8
    if got != len(buf) or got < head + DIGEST or bytes(buf[:len(MAGIC)]) != MAGIC:
        return None
    view = memoryview(buf)
    if hashlib.sha256(view[:-DIGEST]).digest() != bytes(view[-DIGEST:]):
        return None
    (doc_len,) = struct.unpack_from("<Q", buf, len(MAGIC))
    try:
        doc = json.loads(bytes(view[head:head + doc_len]))
    except ValueError:
        return None
    start = -(-(head + doc_len) // ALIGN) * ALIGN
    if doc.get("key") != key or start + doc["payload"] + DIGEST != got:
        return None
    arrays = {}
    for spec in doc["arrays"]:
        dtype = _DTYPES[spec["dtype"]]
        shape = tuple(spec["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        arrays[spec["name"]] = np.frombuffer(buf, dtype=dtype, count=count, offset=start + spec["offset"]).reshape(shape)
    return arrays, doc["meta"]


def _touch(path: Path) -> None:
    # An explicit time: a file system stamps writes with a clock of a few milliseconds' ticks,
    # too coarse to order the entries one process writes in a burst.
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:
        pass


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# --- the reference as arrays ---------------------------------------------------------------------
def _trailing_fill(o_partials: np.ndarray, lse_partials: np.ndarray, scale: np.ndarray | None) -> int:
    """Splits [0, used) hold everything: every later split is O = +0, LSE = -inf and row scale +0,
    bit for bit (what attention_splitkv leaves in a split no piece reached)."""
    S = o_partials.shape[0]
    o = o_partials.reshape(S, -1).view(np.uint32)
    lse = lse_partials.reshape(S, -1).view(np.uint32)
    sc = scale.reshape(S, -1).view(np.uint32) if scale is not None else None
    used = S
    while used > 1 and not o[used - 1].any() and not (lse[used - 1] != _NEG_INF_F32).any() \
            and (sc is None or not sc[used - 1].any()):
        used -= 1
    return used


def _pack_reference(ref: SplitKVResult, low: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    scales = ref.row_scales
    S = ref.o_partials.shape[0]
    used = _trailing_fill(ref.o_partials, ref.lse_partials, scales.partials if scales else None)
    views = S == 1 and np.shares_memory(ref.out_f32, ref.o_partials) and np.shares_memory(ref.lse_f32, ref.lse_partials)
    arrays = {"o_partials": ref.o_partials[:used], "lse_partials": ref.lse_partials[:used],
              "valid_splits": ref.valid_splits, "low": low}
    if scales is not None:
        arrays["scale_partials"] = scales.partials[:used]
    if not views:
        arrays["out_f32"], arrays["lse_f32"] = ref.out_f32, ref.lse_f32
        if scales is not None:
            arrays["scale_out"] = scales.out
    meta = {"splits": S, "views": bool(views), "block_n": ref.block_n,
            "storage": [np.dtype(d).name for d in ref.storage], "magnitude": scales is not None}
    return arrays, meta


def _full(stored: np.ndarray, splits: int, fill: float) -> np.ndarray:
    if stored.shape[0] == splits:
        return stored
    out = np.full((splits, *stored.shape[1:]), fill, dtype=stored.dtype) if fill else \
        np.zeros((splits, *stored.shape[1:]), dtype=stored.dtype)
    out[:stored.shape[0]] = stored
    return out


def _unpack_reference(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[SplitKVResult, np.ndarray]:
    S = meta["splits"]
    o = _full(arrays["o_partials"], S, 0.0)
    lse = _full(arrays["lse_partials"], S, -np.inf)
    scale = _full(arrays["scale_partials"], S, 0.0) if meta["magnitude"] else None
    if meta["views"]:
        out_f32, lse_f32, scale_out = o[0], lse[0], scale[0] if scale is not None else None
    else:
        out_f32, lse_f32, scale_out = arrays["out_f32"], arrays["lse_f32"], arrays.get("scale_out")
    ref = SplitKVResult(out_f32=out_f32, lse_f32=lse_f32, o_partials=o, lse_partials=lse,
                        valid_splits=arrays["valid_splits"], block_n=meta["block_n"],
                        row_scales=RowScales(scale_out, scale) if scale is not None else None,
                        storage=tuple(_DTYPES[n] for n in meta["storage"]))
    return ref, arrays["low"]
