"""Builds of attnsweep.toml run confined: bubblewrap (Debian: apt-get install bubblewrap; .ci/run installs it)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    if shutil.which("bwrap") is None:
        for item in items:
            if here in Path(item.fspath).parents and "needs_bwrap" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="bubblewrap is not installed: apt-get install bubblewrap "
                                                        "(.ci/run does)"))


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Path:  # noqa: ANN001
    """ATTNSWEEP_KERNEL_CACHE in a folder of the test's own: built trees, confined caches."""
    from settings import get_settings

    cache = tmp_path / "kcache"
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(cache))
    get_settings.cache_clear()
    yield cache
    get_settings.cache_clear()
