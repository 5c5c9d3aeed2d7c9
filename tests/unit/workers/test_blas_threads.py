"""`attnsweep worker --concurrency N` caps BLAS at one thread per process, as `run --jobs N` does.

Celery's prefork children are forked from the worker's parent and inherit the BLAS it loaded
with numpy, so the cap has to be in the environment before the parent imports workers.start
(which imports numpy). A stand-in workers.start records the variables at that moment.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.threads import BLAS_THREAD_VARS

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import json, os, sys, types
VARS = {vars!r}
seen = {{}}
stand_in = types.ModuleType("workers.start")
class WorkerStartError(RuntimeError):
    pass
def start_worker(settings, kind, **options):
    seen["concurrency"] = options["concurrency"]
def __getattr__(name):  # the moment `from workers.start import ...` runs
    names = {{"WorkerStartError": WorkerStartError, "start_worker": start_worker}}
    if name not in names:
        raise AttributeError(name)
    seen.setdefault("at_import", {{var: os.environ.get(var) for var in VARS}})
    return names[name]
stand_in.__getattr__ = __getattr__
import workers
sys.modules["workers.start"] = stand_in
from cli.main import app
app(["worker", "--queue", "cpu", "--concurrency", sys.argv[1]], standalone_mode=False)
print(json.dumps(seen))
"""


def _worker_env(concurrency: int, preset: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARS}
    env.update(preset or {}, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(vars=BLAS_THREAD_VARS), str(concurrency)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["concurrency"] == concurrency
    return seen["at_import"]


def test_several_worker_processes_get_one_blas_thread_each_before_numpy_loads():
    assert _worker_env(4) == {var: "1" for var in BLAS_THREAD_VARS}


def test_a_single_worker_process_keeps_blas_threads():
    assert _worker_env(1) == {var: None for var in BLAS_THREAD_VARS}


def test_an_explicit_setting_wins():
    got = _worker_env(4, {"OPENBLAS_NUM_THREADS": "3"})
    assert got["OPENBLAS_NUM_THREADS"] == "3" and got["OMP_NUM_THREADS"] == "1"


def test_the_embedded_pool_uses_the_same_cap(monkeypatch):
    import workers.embedded as embedded

    for var in BLAS_THREAD_VARS:
        monkeypatch.setenv(var, "")  # registers the restore at teardown, then unset
        monkeypatch.delenv(var)
    # Stop before any process starts: the cap is set by then.
    monkeypatch.setattr(embedded.mp, "get_context", lambda _how: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        cfg = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=8, num_heads_q=1, num_heads_kv=1, head_dim_qk=8, head_dim_v=8)
        list(embedded._results([cfg], "cpu", frozenset(), jobs=2))
    assert {var: os.environ.get(var) for var in BLAS_THREAD_VARS} == {var: "1" for var in BLAS_THREAD_VARS}
