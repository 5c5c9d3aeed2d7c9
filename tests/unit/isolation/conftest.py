"""The confinement needs bubblewrap (Debian: apt-get install bubblewrap; .ci/run installs it)."""
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
