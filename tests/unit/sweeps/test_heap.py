"""sweeps.heap: freed memory stays mapped up to the limit, and only up to it.

Each case runs in a fresh interpreter: the setting is process-wide and cannot be undone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from settings import Settings
from sweeps.heap import _libc, retain_freed_memory

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20

pytestmark = pytest.mark.skipif(_libc() is None, reason="glibc only (mallopt)")

PROBE = textwrap.dedent("""
    import json, os, resource, sys
    import numpy as np
    from sweeps.heap import retain_freed_memory

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    retain_mb, size = int(sys.argv[1]), int(sys.argv[2])
    applied = retain_freed_memory(retain_mb)
    base = rss()
    a = np.ones(size, np.uint8)
    del a
    after_free = rss()
    f0 = faults()
    a = np.ones(size, np.uint8)
    print(json.dumps({"applied": applied, "refaults": faults() - f0, "kept": after_free - base}))
""")


def probe(retain_mb: int, size: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", PROBE, str(retain_mb), str(size)], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_freed_block_is_reused_without_faulting_it_in_again():
    got = probe(256, 64 * MiB)
    assert got["applied"] is True
    # 64 MiB is 32 huge pages or 16,384 small ones: faulting it in again costs at least 32.
    assert got["refaults"] < 8, got
    assert got["kept"] >= 60 * MiB, got


def test_zero_leaves_glibc_returning_big_blocks():
    got = probe(0, 64 * MiB)
    assert got["applied"] is False
    assert got["refaults"] >= 32, got
    assert got["kept"] < 8 * MiB, got


def test_memory_beyond_the_limit_goes_back_to_the_system():
    got = probe(64, 512 * MiB)
    assert got["applied"] is True
    assert 56 * MiB <= got["kept"] <= 72 * MiB, got
    assert got["refaults"] >= (512 - 72) // 2, got


def test_out_of_range_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="heap_retain_mb=4096"):
        retain_freed_memory(4096)
    with pytest.raises(ValidationError, match="heap_retain_mb"):
        Settings(heap_retain_mb=-1)
