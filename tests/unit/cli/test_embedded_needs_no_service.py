"""`attnsweep run` (the embedded default) needs none of the service's libraries: a GPU host
carries only what the embedded run imports (docs/decisions.md), so the run must not load the
broker's, the queue's or the web framework's packages, lazily or not."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICE_ONLY = ("celery", "kombu", "redis", "fastapi", "starlette", "uvicorn", "prometheus_client")

# Run in a fresh interpreter in which importing any of SERVICE_ONLY fails.
SCRIPT = f"""
import sys
BLOCKED = {SERVICE_ONLY!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked: " + name)
        return None
sys.meta_path.insert(0, Block())
from cli.main import app
app(["run", "--backend", "cpu", "--samples", "3", "--seed", "2", "--db", sys.argv[1]], standalone_mode=False)
print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_an_embedded_cpu_sweep_runs_without_the_service_libraries(tmp_path):
    db = f"sqlite:///{tmp_path / 'e.db'}"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, db], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "loaded: []" in proc.stdout
    assert "3 configs" in proc.stdout + proc.stderr
