"""A hand-made change to the kernels' arithmetic, with no defect switch, through a CI sweep of
its commit (tools/evidence/ci_evidence.py: the webhook, the bundle, the worker's own execute_batch,
the verdict): the hostemu backend runs the changed source and fails the pull request's commit;
the cpu backend's numpy model of the kernels cannot see the change and passes it."""
from __future__ import annotations

import json
import shutil

import pytest

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="hostemu needs a C++20 compiler")

# f32 (the tightest gates) and head dims <= 32: every config takes the grouped path, which the
# hand edit changes, and few variants compile.
SPEC = {"dtypes": ["f32"], "ranges": {"seq_len_k": [1, 200], "seq_len_q": [1, 4], "g": [1, 2], "num_heads_q": [1, 4],
                                      "num_heads_kv": [1, 4], "head_dim_qk": [1, 32], "head_dim_v": [1, 32]}}


def _ci_evidence():
    # Imported by its package path: the script's worker processes are spawned and import it so.
    from tools.evidence import ci_evidence

    return ci_evidence


@needs_cxx
@pytest.mark.parametrize("backend, expect", [("hostemu", "fail"), ("cpu", "pass")])
def test_a_hand_made_source_change_fails_on_hostemu_and_passes_on_cpu(backend, expect, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNSWEEP_KERNEL_CACHE", str(tmp_path / "kcache"))
    out = tmp_path / "out"
    rc = _ci_evidence().main(["--out", str(out), "--backend", backend, "--samples", "16", "--edit", "grouped_last_key",
                              "--spec", json.dumps(SPEC), "--jobs", "2", "--batch", "8", "--expect-b", expect])
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    got = summary["commits"]
    assert rc == 0, printed
    assert got["A"]["verdict"] == "pass" and got["C"]["verdict"] == "pass"
    b = got["B"]
    assert b["configs"] == 16 and b["verdict"] == expect
    assert f"B pull_request {b['commit_sha'][:12]} verdict={expect}" in printed
    if expect == "fail":
        assert b["new_failure_count"] == b["failures"] > 0 and b["compiler_version"]
        assert all(f["outcome"] in ("fail", "nan") for f in b["new_failures"])
        junit = (out / "junit-B.xml").read_text()
        assert "<failure" in junit
    else:
        assert b["failures"] == 0
