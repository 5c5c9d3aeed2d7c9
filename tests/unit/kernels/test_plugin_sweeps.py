"""Sweeps of kernels that did not ship, as a user runs them: a plug-in package installed from
tests/plugins through its entry points, and the C-ABI example built with the host's compiler,
each swept by `attnsweep run` on the cpu, confined; a plug-in that raises, returns the wrong
shape, returns NaN or never returns ends each such config with its own outcome and one line,
and the sweep goes on."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--dtypes", "f16,f32", "--range", "seq_len_k=1:256", "--range", "g=1:4", "--range", "seq_len_q=1:16",
         "--range", "head_dim_qk=1:64", "--range", "head_dim_v=1:64", "--no-triage"]

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="a kernel that did not ship runs only confined (Debian: apt-get install bubblewrap)")


def attnsweep(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "ATTNSWEEP_PROGRESS_INTERVAL_S": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(ROOT)) if p)}
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT)


def rows(db: Path, sweep: int = 1) -> list[dict]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM config_runs WHERE sweep_id = ? ORDER BY seq", (sweep,))]


def sweep_row(db: Path, sweep: int = 1) -> dict:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return dict(conn.execute("SELECT * FROM sweeps WHERE id = ?", (sweep,)).fetchone())


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> str:
    """tests/plugins/sample_kernel installed into a folder of its own: its entry points appear
    where that folder is on the path."""
    target = tmp_path_factory.mktemp("site")
    target.chmod(0o755)   # the confined process runs as the sandbox's own uid, which must read it
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(ROOT / "tests/plugins/sample_kernel")], check=True, capture_output=True, timeout=300)
    return str(target)


def test_an_installed_package_s_kernels_are_listed(package):
    listed = {r["name"]: r for r in json.loads(attnsweep("kernels", "--json", pythonpath=package).stdout)}
    assert listed["numpy-attention"]["package"] == "attnsweep-sample-kernel 0.1.0"
    assert not listed["numpy-attention"]["trusted"] and not listed["misbehaving"]["trusted"]
    assert listed["torch-sdpa:math"]["trusted"] and "numpy-attention" not in json.loads(attnsweep("kernels", "--json").stdout)[0]


def test_a_package_s_kernel_is_swept_through_its_entry_point(package, tmp_path):
    db = tmp_path / "s.db"
    proc = attnsweep("run", "--kernel", "numpy-attention", "--samples", "8", "--seed", "4", "--db", str(db), *SMALL,
                     "--junit-xml", str(tmp_path / "j.xml"), pythonpath=package)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernel numpy-attention 0.1.0" in proc.stderr
    results = rows(db)
    assert len(results) == 8 and {r["outcome"] for r in results} == {"pass"}
    assert {(r["kernel"], r["kernel_version"]) for r in results} == {("numpy-attention", "0.1.0")}
    assert all(r["reproducer"].startswith("attnsweep verify --kernel numpy-attention ") for r in results)
    assert (sweep_row(db)["kernel"], sweep_row(db)["kernel_name"]) == ("numpy-attention", "numpy-attention")
    assert 'kernel="numpy-attention 0.1.0"' in (tmp_path / "j.xml").read_text()


BEHAVIOUR = {0: ("pass", None), 1: ("error", "kernel misbehaving: run() raised ValueError: the kernel gave up on this config"),
             2: ("error", "kernel misbehaving: returned out of shape"), 3: ("nan", "non-finite values"),
             4: ("timeout", "exceeded the per-config time limit of 8 s")}


def test_a_misbehaving_kernel_ends_each_config_with_its_outcome_and_the_sweep_goes_on(package, tmp_path):
    db = tmp_path / "s.db"
    # Seed 2 draws every behaviour of misbehaving.py among its 10 configs (data_seed % 5).
    proc = attnsweep("run", "--kernel", "misbehaving", "--samples", "10", "--seed", "2", "--time-limit", "8",
                     "--db", str(db), *SMALL, pythonpath=package)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = rows(db)
    assert len(results) == 10 and all(r["state"] == "done" for r in results)
    seen = set()
    for r in results:
        how = json.loads(r["config"])["data_seed"] % 5
        outcome, detail = BEHAVIOUR[how]
        seen.add(how)
        assert r["outcome"] == outcome, (how, r["detail"])
        if detail:
            assert r["detail"].startswith(detail) and "\n" not in r["detail"], r["detail"]
    assert seen == set(BEHAVIOUR)


@pytest.fixture(scope="module")
def host_library(tmp_path_factory) -> Path:
    """examples/c_abi built for the host (its Makefile's `host`, with the host's C++ compiler)."""
    out = tmp_path_factory.mktemp("c_abi")
    out.chmod(0o755)
    subprocess.run(["make", "-s", "-C", str(ROOT / "examples/c_abi"), "host", f"OUT={out}"], check=True, timeout=300)
    return out / "libsplitkv_host.so"


def test_the_c_abi_example_is_built_and_swept(host_library, tmp_path):
    db = tmp_path / "s.db"
    proc = attnsweep("run", "--kernel", f"so:{host_library}", "--samples", "12", "--seed", "6", "--db", str(db),
                     "--dtypes", "f16,bf16,f32,i8", *SMALL[2:])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = rows(db)
    assert len(results) == 12
    assert {r["outcome"] for r in results if json.loads(r["config"])["dtype"] != "i8"} == {"pass"}
    assert {r["not_applicable_reason"] for r in results if json.loads(r["config"])["dtype"] == "i8"} == {"dtype_i8"}
    assert any(json.loads(r["config"])["split_kv"] > 1 for r in results)
    assert {(r["kernel"], r["kernel_version"]) for r in results} == {("c-abi-splitkv-host", "1")}
    passing = next(r for r in results if r["outcome"] == "pass")
    verify = attnsweep(*shlex.split(passing["reproducer"])[1:], "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["kernel"] == "c-abi-splitkv-host", verify.stderr
