"""Guard zones around the buffers of one attention call.

Every buffer a kernel reads or writes is allocated GUARD_BYTES larger on each side. An output's
guards hold CANARY and are read back with the output (one copy of the whole allocation): a
changed byte is a store outside the buffer that did not fault, and the config is a `fault`
naming the buffer, the offset and the bytes. An input's guards hold NaN (the largest value for
integer inputs), so a read past an input that reaches the output shows there as NaN or as a
large error instead of reading whatever the neighbouring allocation held.

256 bytes keep the buffer itself at the allocation's own 256-byte alignment (the 16-byte vector
loads and cp.async of the kernels need 16).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

GUARD_BYTES = 256
CANARY = 0xA5   # byte pattern: as f16 pairs and f32 a finite value no kernel writes on its own


@dataclass(frozen=True)
class GuardViolation:
    buffer: str
    side: str            # "before" or "after"
    offset: int          # bytes from the buffer's first byte (negative before it) or past its end
    changed: int         # bytes of that guard that no longer hold the canary
    itemsize: int

    def describe(self, writers: Sequence[str] = ()) -> str:
        """The violation in one line. `writers`: the kernels of the call that were given the
        buffer's address; one alone is the store's author (no other kernel could address it)."""
        where = (f"{-self.offset} bytes before its start" if self.side == "before"
                 else f"{self.offset} bytes past its end")
        text = (f"store outside {self.buffer}: {self.changed} bytes of the guard {self.side} it changed, "
                f"the nearest {where} ({self.itemsize}-byte elements)")
        if len(writers) == 1:
            return f"{text}; {writers[0]} is the one kernel of the call given {self.buffer}"
        if writers:
            return f"{text}; the kernels of the call given {self.buffer}: {', '.join(writers)}"
        return text


def padded_bytes(nbytes: int, guard: int = GUARD_BYTES) -> int:
    return nbytes + 2 * guard


def fill_value_bits(dtype: np.dtype) -> tuple[int, int]:
    """(element size, bit pattern) that an input's guards hold: quiet NaN for floats, the
    largest value for integers (there is no NaN to read)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        if dtype.itemsize == 4:
            return 4, 0x7FC00000
        if dtype == np.float16:
            return 2, 0x7E00
        return 2, 0x7FC0   # bfloat16
    if dtype.itemsize == 4:
        return 4, 0x7FFFFFFF
    if dtype.itemsize == 2:
        return 2, 0x7FFF
    return 1, 0x7F


def check_guards(buffer: str, raw: np.ndarray, nbytes: int, itemsize: int,
                 guard: int = GUARD_BYTES) -> GuardViolation | None:
    """The first guard of `raw` (the whole allocation read back as uint8) that lost its canary."""
    if guard == 0:
        return None
    before = np.flatnonzero(raw[:guard] != CANARY)
    after = np.flatnonzero(raw[guard + nbytes:guard + nbytes + guard] != CANARY)
    if after.size:   # a store past the end is the commoner bug; report it first
        return GuardViolation(buffer, "after", int(after[0]), int(after.size), itemsize)
    if before.size:
        return GuardViolation(buffer, "before", int(before[-1]) - guard, int(before.size), itemsize)
    return None
