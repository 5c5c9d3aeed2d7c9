"""isolation/wire.py: frames of a JSON header and raw arrays, checked before anything is allocated."""
from __future__ import annotations

import json
import os
import pickle
import struct
import threading

import ml_dtypes
import numpy as np
import pytest

from isolation.wire import MAX_HEADER_BYTES, PeerGone, WireError, receive, send


def _pipe_with(data: bytes) -> int:
    r, w = os.pipe()

    def write() -> None:
        os.write(w, data)
        os.close(w)

    threading.Thread(target=write, daemon=True).start()
    return r


def _frame(header: dict) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text


def test_arrays_of_every_dtype_come_back_bit_for_bit():
    arrays = {"q": np.arange(24, dtype=np.float16).reshape(2, 3, 4),
              "k": np.array([[1.5, -2.25]], dtype=ml_dtypes.bfloat16),
              "i": np.array([-8, 7], dtype=np.int8), "lse": np.full((2, 2), np.nan, dtype=np.float32),
              "empty": np.zeros((0, 5), dtype=np.float64), "t": np.arange(6, dtype=np.float32).reshape(2, 3).T}
    r, w = os.pipe()
    sender = threading.Thread(target=send, args=(w, {"op": "run", "x": [1, 2]}, arrays))
    sender.start()
    header, got = receive(r, 1 << 20)
    sender.join()
    assert header == {"op": "run", "x": [1, 2]}
    for name, array in arrays.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        assert got[name].tobytes() == np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("arrays, rule", [
    ([{"name": "x", "dtype": "object", "shape": [1]}], "dtype 'object'"),
    ([{"name": "x", "dtype": "<U4", "shape": [1]}], "dtype '<U4'"),
    ([{"name": "x", "dtype": "float32", "shape": [-1]}], "shape"),
    ([{"name": "x", "dtype": "float32", "shape": [2.5]}], "shape"),
    ([{"name": "x", "dtype": "float32", "shape": [1] * 9}], "shape"),
    ([{"name": "x", "dtype": "float64", "shape": [1 << 20]}], "limit"),
    ([{"dtype": "float32", "shape": [1]}], "needs a name"),
])
def test_a_frame_that_breaks_a_rule_is_refused_before_anything_is_allocated(arrays, rule):
    with pytest.raises(WireError, match=rule):
        receive(_pipe_with(_frame({"ok": True, "arrays": arrays})), 1 << 20)


def test_a_pickle_is_never_unpickled_and_a_huge_header_is_refused_unread():
    class Boom:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, ("touch /tmp/attnsweep-wire-pwned",))

    payload = pickle.dumps(Boom())
    with pytest.raises(WireError):
        receive(_pipe_with(struct.pack("<Q", len(payload)) + payload), 1 << 20)
    assert not os.path.exists("/tmp/attnsweep-wire-pwned")
    with pytest.raises(WireError, match="over the limit"):
        receive(_pipe_with(struct.pack("<Q", MAX_HEADER_BYTES + 1)), 1 << 20)
    with pytest.raises(WireError, match="JSON object"):
        receive(_pipe_with(_frame([1, 2])), 1 << 20)


def test_end_of_file_and_a_deadline():
    with pytest.raises(PeerGone):
        receive(_pipe_with(b""), 0)
    r, w = os.pipe()
    import time

    with pytest.raises(TimeoutError):
        receive(r, 0, deadline=time.monotonic() + 0.2)
    os.close(w)
