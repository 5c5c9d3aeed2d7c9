"""tests/gpu/test_cuda_backend.py's cases and checks (CASES, MMA_CASES, random_configs, as_mma,
check_run, ...) for tools/evidence/gpu_evidence.py. tests/gpu is no package, so the module is
loaded by its path, once."""
from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_by_path(name: str, path: Path) -> ModuleType:
    """The module at `path`, imported under `name` (registered, so a second call gets the same)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=1)
def gpu_suite() -> ModuleType:
    return load_by_path("attnsweep_gpu_suite", ROOT / "tests/gpu/test_cuda_backend.py")
