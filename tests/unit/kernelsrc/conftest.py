"""Builds of attnsweep.toml run confined (tests marked needs_bwrap: tests/conftest.py skips them without bubblewrap)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Path:  # noqa: ANN001
    """ATTNSWEEP_KERNEL_CACHE in a folder of the test's own: built trees, confined caches."""
    from settings import get_settings

    cache = tmp_path / "kcache"
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(cache))
    get_settings.cache_clear()
    yield cache
    get_settings.cache_clear()
