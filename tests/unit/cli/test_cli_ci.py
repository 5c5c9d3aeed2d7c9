"""`attnsweep` in CI: JUnit XML, the exit status, the failure table, plain progress lines, one-line errors."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import click
import pytest
import typer

from cli.main import app
from kernels.backends.base import DEFECTS

# Two numeric defects on small sizes: the cpu emulation fails some configs within seconds.
SMALL = ["--range", "seq_len_k=1:512", "--range", "seq_len_q=1:64"]
BROKEN = ["--defect", "no_zero_sum_guard", "--defect", "causal_off_by_one"]


def attnsweep(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


@pytest.fixture(scope="module")
def broken_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("broken")
    db, xml, report = tmp / "s.db", tmp / "junit.xml", tmp / "report.json"
    proc = attnsweep("run", "--samples", "8", "--seed", "3", "--backend", "cpu", "--db", str(db), "--junit-xml", str(xml),
                     "--report-json", str(report), *SMALL, *BROKEN, env={"ATTNSWEEP_PROGRESS_INTERVAL_S": "0"})
    return proc, db, xml, json.loads(report.read_text())


def test_failing_outcomes_exit_1_and_junit_lists_them(broken_sweep):
    proc, _db, xml, report = broken_sweep
    failing = sum(report["outcomes"][o] for o in ("fail", "nan", "fault", "unsafe"))
    assert failing > 0, report["outcomes"]
    assert proc.returncode == 1, proc.stderr
    assert "failing outcomes (--fail-on)" in proc.stderr and "Traceback" not in proc.stderr
    root = ET.parse(xml).getroot()
    assert root.get("tests") == "8" and int(root.get("failures")) == failing
    cases = root.findall(".//testcase")
    assert len(cases) == 8 and len([c for c in cases if c.find("failure") is not None]) == failing
    assert all("reproducer: attnsweep verify" in c.find("failure").text for c in cases if c.find("failure") is not None)
    messages = [c.find("failure").get("message") for c in cases if c.find("failure") is not None]
    # The gate is named once: "row: out_row_err=... > ...", never "row: row: ...".
    assert any(re.search(r"\b(rms|row|lse): out_", m) for m in messages), messages
    assert not [m for m in messages if re.search(r"\b(rms|row|lse|partials|err_ratio): \1:", m)], messages


def test_fail_on_names_the_outcomes_that_count(tmp_path):
    # The same broken sweep passes when only oom counts, and a clean one fails when pass counts.
    args = ["run", "--samples", "4", "--seed", "3", "--backend", "cpu", "--db", str(tmp_path / "a.db"), *SMALL]
    assert attnsweep(*args, *BROKEN, "--fail-on", "oom").returncode == 0
    assert attnsweep(*args, "--fail-on", "fail,nan").returncode == 0
    proc = attnsweep(*args, "--fail-on", "pass")
    assert proc.returncode == 1 and "failing outcomes (--fail-on): pass 4" in proc.stderr


def test_progress_is_plain_lines_off_a_terminal(broken_sweep):
    proc = broken_sweep[0]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("configs ")]
    assert [ln.split()[1] for ln in lines] == [f"{i}/8" for i in range(1, 9)]
    assert lines[-1].startswith("configs 8/8 (100%)")
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr  # no bar redraws, no colour codes


def test_failures_prints_gate_metric_bound_and_reproducer(broken_sweep):
    _proc, db, _xml, report = broken_sweep
    failing = sum(report["outcomes"][o] for o in ("fail", "nan", "fault", "unsafe", "error", "timeout", "oom"))
    proc = attnsweep("failures", str(report["sweep_id"]), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "metric vs bound" in proc.stdout and f"{failing} failures" in proc.stdout
    assert proc.stdout.count("attnsweep verify --backend cpu --config") == failing
    assert " > " in proc.stdout
    data = json.loads(attnsweep("failures", "--db", str(db), "--json").stdout)
    assert len(data["failures"]) == failing and data["has_more"] is False
    for row in data["failures"]:
        assert row["outcome"] in ("fail", "nan") and row["check"]["gate"] == row["failed_gate"]
        assert row["check"]["metric"] and row["check"]["bound"] is not None
    only_fail = json.loads(attnsweep("failures", "--db", str(db), "--json", "--outcome", "fail").stdout)["failures"]
    assert len(only_fail) == report["outcomes"]["fail"] and all(r["outcome"] == "fail" for r in only_fail)
    assert len(json.loads(attnsweep("failures", "--db", str(db), "--json", "--limit", "1").stdout)["failures"]) == 1


def test_failures_filter_by_data_regime(broken_sweep):
    _proc, db, _xml, _report = broken_sweep
    every = json.loads(attnsweep("failures", "--db", str(db), "--json").stdout)["failures"]
    by_regime = {}
    for regime in {r["data_regime"] for r in every}:
        rows = json.loads(attnsweep("failures", "--db", str(db), "--json", "--regime", regime).stdout)["failures"]
        assert rows and all(r["data_regime"] == regime == r["config"].get("data_regime", "normal") for r in rows)
        by_regime[regime] = len(rows)
    assert sum(by_regime.values()) == len(every)
    proc = attnsweep("failures", "--db", str(db), "--regime", "spiky")
    assert proc.returncode == 2 and "--regime='spiky': must be one of normal, sink" in proc.stderr


def test_version():
    from importlib import metadata

    proc = attnsweep("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"attnsweep {metadata.version('attnsweep')}"


@pytest.mark.parametrize("args, line", [
    (["verify", "--config", "@missing.json"], "error: --config @missing.json: cannot read the file: No such file or directory"),
    (["run", "--backend", "cpu", "--db", "/nonexistent-34/x.db"],
     "error: --db: the folder '/nonexistent-34' of the SQLite file does not exist (create it first)"),
    (["run", "--backend", "cpu", "--range", "g=9:1"], "error: --range g: g=9:1: lo must be <= hi"),
    (["run", "--backend", "cpu", "--range", "g=abc"], "error: range: --range 'g=abc': expected NAME=LO:HI with integers"),
    (["run", "--backend", "cpu", "--fail-on", "fail,bogus"], "error: --fail-on 'fail,bogus': unknown outcome 'bogus'"),
    (["run", "--backend", "cpu", "--junit-xml", "/nonexistent-34/j.xml"], "error: --junit-xml: the folder '/nonexistent-34' does not exist"),
    (["failures", "--db", "/tmp/nonexistent-34.db"], "error: --db: no database at '/tmp/nonexistent-34.db'"),
    (["failures", "--outcome", "pass", "--db", "/tmp/nonexistent-34.db"], "error: --db: no database at"),
])
def test_user_mistakes_are_one_line_exit_2(args, line, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(line), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.integration
def test_missing_postgresql_database_is_one_line(pg_url):
    missing = pg_url.rsplit("/", 1)[0] + "/attnsweep_no_such_database"
    proc = attnsweep("run", "--backend", "cpu", "--samples", "1", "--db", missing)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: --db: cannot open the database {missing}: "
                           'database "attnsweep_no_such_database" does not exist\n')


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def test_every_option_and_argument_has_help():
    root = typer.main.get_command(app)
    missing = [f"{name} {p.name}" for name, cmd in _commands(root) for p in cmd.params if not getattr(p, "help", None)]
    assert not missing, missing
    assert all(cmd.help for _name, cmd in _commands(root))


@pytest.mark.parametrize("command", ["run", "verify"])
def test_help_lists_every_defect(command):
    proc = attnsweep(command, "--help", env={"COLUMNS": "400"})
    assert proc.returncode == 0
    for name in DEFECTS:
        assert name in proc.stdout, name
