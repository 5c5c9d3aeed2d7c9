"""Every test here starts and ends with freshly read settings: a test that sets an ATTNSWEEP_*
variable (monkeypatch.setenv, then get_settings.cache_clear()) leaves no cached value behind."""
from __future__ import annotations

from typing import Iterator

import pytest

from settings import get_settings


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
