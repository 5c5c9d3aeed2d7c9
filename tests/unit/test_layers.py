"""The layer contract of pyproject.toml ([tool.importlinter], checked by import-linter): each
layer imports only the layers below it (docs/decisions.md, "Where things live"), lazy imports
inside functions included, and no package's modules import each other in a cycle."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = len(CONFIG["contracts"])


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    # import-linter reads the packages importable from its working folder (the tree under test).
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120)


def _copy_tree(dest: Path) -> None:
    for package in CONFIG["root_packages"]:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


# Folders of Python outside the contract: the tests; the migrations (alembic loads them by path);
# deploy/, whose smoke script runs on the host's python3 and imports nothing of the project;
# examples/, kernel plug-ins as a user writes them: packages of their own, installed or loaded by
# path, that import the project only through its plug-in interface.
OUTSIDE = {"tests", "migrations", "deploy", "examples"}


def test_every_folder_of_python_is_under_the_contract():
    folders = {p.name for p in ROOT.iterdir()
               if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.py"))} - OUTSIDE
    assert folders == set(CONFIG["root_packages"])


def test_the_tree_keeps_the_contract():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in proc.stdout


@pytest.mark.parametrize("module, planted, arrow", [
    ("sweeps/spec.py", "\n\ndef _planted():\n    import api.main\n", "sweeps is not allowed to import api"),
    ("bench/kernels.py", "\n\ndef _planted():\n    import tools.tuning\n", "bench is not allowed to import tools"),
    ("settings/__init__.py", "\nfrom attnconfig import AttentionConfig\n", "settings is not allowed to import attnconfig"),
    ("ci/verdict.py", "\nimport triage.cluster\n", "ci is not allowed to import triage"),
    ("workers/execute.py", "\n\ndef _planted():\n    from harness import free_port\n", "workers.execute -> harness"),
    ("workers/registry.py", "\n\ndef _planted():\n    from sqlalchemy import select\n",
     "workers is not allowed to import sqlalchemy"),
])
def test_an_upward_or_sideways_import_breaks_the_contract(tmp_path, module, planted, arrow):
    _copy_tree(tmp_path)
    with open(tmp_path / module, "a") as f:
        f.write(planted)
    proc = _lint(tmp_path)
    assert proc.returncode == 1
    assert arrow in proc.stdout
    assert re.search(rf"Contracts: {CONTRACTS - 1} kept, 1 broken", proc.stdout)


def test_a_cycle_inside_a_package_breaks_the_contract(tmp_path):
    _copy_tree(tmp_path)
    with open(tmp_path / "store" / "models.py", "a") as f:
        f.write("\n\ndef _planted():\n    from store import repo\n")
    proc = _lint(tmp_path)
    assert proc.returncode == 1
    assert "No cycles are allowed in store" in proc.stdout
