"""`make test` with its services down: one line says which are down and why, and every test that
needs one fails with that reason (a run without them never passes)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(port: int) -> dict[str, str]:
    return {**os.environ, "ATTNSWEEP_TEST_PG": f"postgresql://postgres@127.0.0.1:{port}/postgres",
            "ATTNSWEEP_TEST_REDIS": f"redis://127.0.0.1:{port}/0"}


def test_the_line_names_each_service_down_and_the_tests_that_need_it_fail():
    port = _closed_port()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/integration/test_metrics.py", "tests/unit/store/test_db.py"],
                          cwd=ROOT, env=_env(port), capture_output=True, text=True, timeout=300)
    out = proc.stdout
    line = next(x for x in out.splitlines() if x.startswith("services: "))
    assert f"PostgreSQL at postgresql://postgres@127.0.0.1:{port}/postgres DOWN (" in line
    assert f"Redis at redis://127.0.0.1:{port}/0 DOWN (" in line
    assert proc.returncode == 1, out[-2000:]
    assert f"needs PostgreSQL at postgresql://postgres@127.0.0.1:{port}/postgres, which is down" in out
    assert " passed" in out.splitlines()[-1]   # the tests that need no service still ran
    assert "error" in out.splitlines()[-1]


def test_the_command_prints_the_line_for_make_test():
    port = _closed_port()
    proc = subprocess.run([sys.executable, "-m", "tests.services"], cwd=ROOT, env=_env(port),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.count("\n") == 1
    assert proc.stdout.startswith(f"services: PostgreSQL at postgresql://postgres@127.0.0.1:{port}/postgres DOWN (")
    assert "so tests/integration fail" in proc.stdout
