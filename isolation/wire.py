"""Messages between a process and the confined process it runs code in: a JSON header, then raw
array bytes. Never pickle: what comes back from a confined process was written by code nobody
vetted, and unpickling runs whatever the bytes say.

A frame is an 8-byte little-endian header length, the header (UTF-8 JSON), then the bytes of
each array the header lists under "arrays" ([{"name", "dtype", "shape"}], in order). A reader
checks what it is sent before it allocates: the header's size, each dtype against ARRAY_DTYPES,
each shape, and the arrays' total against the limit it was given.
"""
from __future__ import annotations

import io
import json
import os
import select
import struct
import time
from math import prod
from typing import Any, Mapping

import numpy as np

_LENGTH = struct.Struct("<Q")
MAX_HEADER_BYTES = 4 << 20   # configs, settings and a compiler's log; the kernel source goes in it too
CHUNK = 1 << 20

# The dtypes inputs and outputs are made of (reference/inputs.py, kernels' RunOutput).
ARRAY_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64", "bfloat16", "bool")


class WireError(RuntimeError):
    """A frame that breaks the rules: too large, a dtype or shape not allowed, not JSON."""


class PeerGone(RuntimeError):
    """The other side closed its end (it ended, or was killed)."""


def _dtype(name: Any) -> np.dtype:
    if name not in ARRAY_DTYPES:
        raise WireError(f"array dtype {name!r} is not one of {', '.join(ARRAY_DTYPES)}")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def send(fd: int, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
    """Write one frame: `header` (JSON-able) and `arrays` (contiguous copies are made where needed)."""
    listed, blobs = [], []
    for name, array in (arrays or {}).items():
        array = np.ascontiguousarray(array)
        _dtype(str(array.dtype))
        listed.append({"name": name, "dtype": str(array.dtype), "shape": list(array.shape)})
        blobs.append(memoryview(array.reshape(-1).view(np.uint8)))
    text = json.dumps({**header, "arrays": listed}, allow_nan=True).encode()
    for view in (memoryview(_LENGTH.pack(len(text)) + text), *blobs):
        while view:
            view = view[os.write(fd, view):]


def _read_into(fd: int, view: memoryview, deadline: float | None) -> None:
    raw = io.FileIO(fd, "rb", closefd=False)
    while view:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError()
        n = raw.readinto(view[:CHUNK])
        if not n:
            raise PeerGone("the other side closed its pipe")
        view = view[n:]


def receive(fd: int, max_array_bytes: int, deadline: float | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read one frame: (header without "arrays", {name: array}). Raises TimeoutError past
    `deadline` (time.monotonic()), PeerGone at end of file, WireError for a frame that breaks the
    rules (arrays over `max_array_bytes` in all included)."""
    length = bytearray(_LENGTH.size)
    _read_into(fd, memoryview(length), deadline)
    (size,) = _LENGTH.unpack(length)
    if size > MAX_HEADER_BYTES:
        raise WireError(f"a header of {size} bytes is over the limit of {MAX_HEADER_BYTES}")
    text = bytearray(size)
    _read_into(fd, memoryview(text), deadline)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"the header is not JSON: {exc}") from None
    listed = header.pop("arrays", []) if isinstance(header, dict) else None
    if not isinstance(header, dict) or not isinstance(listed, list):
        raise WireError("the header is not a JSON object with a list of arrays")
    plan, total = [], 0
    for item in listed:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("shape"), list):
            raise WireError("an array entry needs a name, a dtype and a shape")
        shape = item["shape"]
        if len(shape) > 8 or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1 << 40 for n in shape):
            raise WireError(f"array {item['name']!r}: shape {shape!r} is not a list of at most 8 sizes")
        dtype = _dtype(item.get("dtype"))
        total += prod(shape) * dtype.itemsize
        if total > max_array_bytes:
            raise WireError(f"the arrays of this message pass the limit of {max_array_bytes} bytes")
        plan.append((item["name"], dtype, tuple(shape)))
    arrays = {}
    for name, dtype, shape in plan:
        array = np.empty(shape, dtype=dtype)
        _read_into(fd, memoryview(array.reshape(-1).view(np.uint8)), deadline)
        arrays[name] = array
    return header, arrays
