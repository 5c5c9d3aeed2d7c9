"""From a failing sweep to a bug and its reproducer, through a real subprocess: the failure
table keeps config hashes, says its total, numbers each failure's bug and filters by it;
triage and shrink print reproducers as commands, which fail with their bug's signature; verify
prints a verdict line; bisect ends as git bisect does."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attnconfig import AttentionConfig

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--range", "seq_len_k=1:512", "--range", "seq_len_q=1:64"]


def attnsweep(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSWEEP_")}
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd or ROOT, env={**environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


@pytest.fixture(scope="module")
def bug_sweep(tmp_path_factory):
    db = tmp_path_factory.mktemp("bugs") / "s.db"
    proc = attnsweep("run", "--backend", "cpu", "--samples", "40", "--seed", "3", "--defect", "causal_off_by_one",
                     "--db", str(db), *SMALL)
    assert proc.returncode == 1, proc.stderr[-3000:]
    return str(db)


def failures_json(db: str, *args: str) -> dict:
    proc = attnsweep("failures", "--db", db, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_failure_table_keeps_every_config_hash_and_says_the_total(bug_sweep):
    every = failures_json(bug_sweep)
    total = every["total"]
    assert total == len(every["failures"]) > 3
    proc = attnsweep("failures", "1", "--db", bug_sweep, "--limit", "1000")
    assert proc.returncode == 0, proc.stderr
    # Hashes that start with a letter were once read as markup and vanished.
    hashes = [r["config_hash"][:12] for r in every["failures"]]
    assert any(h[0].isalpha() for h in hashes)
    for h in hashes:
        assert f"[{h}]" in proc.stdout, h
    assert f"{total} failures" in proc.stdout
    limited = attnsweep("failures", "1", "--db", bug_sweep, "--limit", "3")
    assert f"3 of {total} failures shown; raise --limit" in limited.stdout
    assert failures_json(bug_sweep, "--limit", "3")["total"] == total


def test_failures_name_their_bug_and_filter_by_it(bug_sweep):
    triage = json.loads(attnsweep("triage", "1", "--db", bug_sweep, "--json").stdout)
    sizes = [c["size"] for c in triage["clusters"]]
    rows = failures_json(bug_sweep, "1")["failures"]
    for n, size in enumerate(sizes, 1):
        assert sum(r["bug"] == n for r in rows) == size
        only = failures_json(bug_sweep, "1", "--bug", str(n))
        assert only["total"] == size and all(r["bug"] == n for r in only["failures"])
    proc = attnsweep("failures", "1", "--db", bug_sweep)
    header = next(ln for ln in proc.stdout.splitlines() if "outcome" in ln and "sweep" in ln)
    assert re.search(r"\bbug\b", header), header
    beyond = attnsweep("failures", "1", "--db", bug_sweep, "--bug", str(len(sizes) + 1))
    assert beyond.returncode == 2
    assert beyond.stderr == f"error: --bug {len(sizes) + 1}: sweep 1 has {len(sizes)} bug{'s' if len(sizes) > 1 else ''}\n"
    unnamed = attnsweep("failures", "--db", bug_sweep, "--bug", "1")
    assert unnamed.returncode == 2 and unnamed.stderr.startswith("error: --bug: name the SWEEP too")


def _compact(config_text: str) -> None:
    """Only required fields, fields off their defaults and the data seed."""
    fields = AttentionConfig.model_fields
    for key, value in json.loads(config_text).items():
        assert key == "data_seed" or fields[key].is_required() or value != fields[key].default, key


def test_each_bugs_reproducer_fails_with_its_signature(bug_sweep):
    triage = json.loads(attnsweep("triage", "1", "--db", bug_sweep, "--json").stdout)
    assert triage["clusters"]
    for c in triage["clusters"]:
        sig = c["signature"]
        assert c["reproducer_signature"] == sig, c
        argv = shlex.split(c["reproducer"])
        assert argv[:2] == ["attnsweep", "verify"]
        _compact(argv[argv.index("--config") + 1])
        proc = attnsweep(*argv[1:], "--json")
        out = json.loads(proc.stdout)
        assert (out["outcome"], out["failed_gate"]) == (sig["outcome"], sig["gate"]), (c["reproducer"], out)
        assert proc.returncode == 1
        line = attnsweep(*argv[1:])
        assert line.returncode == 1 and line.stdout.count("\n") == 1
        assert line.stdout.startswith(f"{sig['outcome']} (gate {sig['gate']}): ")
    table = attnsweep("triage", "1", "--db", bug_sweep)
    assert table.returncode == 0
    for i, c in enumerate(triage["clusters"], 1):
        assert f"bug {i} minimal reproducer: {c['reproducer']}" in table.stdout


def test_stored_reproducers_are_compact(bug_sweep):
    for row in failures_json(bug_sweep)["failures"]:
        argv = shlex.split(row["reproducer"])
        config = argv[argv.index("--config") + 1]
        _compact(config)
        assert "null" not in config and json.loads(config) == {**json.loads(config), **{"data_seed": row["config"].get("data_seed", 0)}}


def test_shrink_prints_the_reproducer_command():
    config = json.dumps(dict(dtype="f16", g=2, seq_len_q=5, seq_len_k=40, num_heads_q=2, num_heads_kv=1, head_dim_qk=16,
                             head_dim_v=16, causal=True, data_seed=4))
    proc = attnsweep("shrink", "--backend", "cpu", "--defect", "causal_off_by_one", "--config", config)
    assert proc.returncode == 0, proc.stderr
    [command] = proc.stdout.splitlines()
    assert command.startswith("attnsweep verify --backend cpu --config ") and command.endswith("--defect causal_off_by_one")
    assert "shrunk in" in proc.stderr and "the minimal reproducer" in proc.stderr
    again = attnsweep(*shlex.split(command)[1:])
    assert again.returncode == 1 and again.stdout.startswith("fail (gate rms): ")


def test_bisect_ends_with_the_first_bad_commit_and_its_subject(kernel_repo):
    from tests.kernel_repo import CONFIG, DEFECT

    repo, shas = kernel_repo
    proc = attnsweep("bisect", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--config", json.dumps(CONFIG))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{shas[DEFECT]} is the first bad commit", f"    revision {DEFECT}"]
