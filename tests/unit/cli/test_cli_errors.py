"""The CLI's one error path, through a real subprocess: every mistake, outage and interruption is
one line on stderr and its exit status (0 pass, 1 failing configs, 2 usage, 3 infrastructure,
130 interrupted); a read command never creates or migrates a database."""
from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def attnsweep(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSWEEP_")}
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", **(env or {})})


def one_line(proc: subprocess.CompletedProcess, code: int, start: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: " + start), proc.stderr
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr
    return proc.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, env, start", [
    (["run", "--backend", "cpu", "--db", "foo://bar"], {},
     "--db 'foo://bar': must be a SQLite file path, a sqlite:/// URL or a postgresql:// URL"),
    (["failures"], {"ATTNSWEEP_DATABASE_URL": "garbage"}, "ATTNSWEEP_DATABASE_URL: must be a sqlite:/// or postgresql://"),
    (["failures"], {"ATTNSWEEP_CONFIG_TIME_LIMIT_S": "abc"}, "ATTNSWEEP_CONFIG_TIME_LIMIT_S: Input should be a valid number"),
    (["run", "--samplez", "3"], {}, "No such option: --samplez (Possible options: --samples) (see attnsweep run --help)"),
    (["run", "--samples", "abc"], {}, "Invalid value for '--samples': Input should be a valid integer"),
    (["run", "--jobs", "0"], {}, "Invalid value for '--jobs': Input should be greater than or equal to 1"),
    (["run", "--backend", "cpu", "--defect", "nope", "--db", "x.db"], {},
     "Invalid value for '--defect': unknown defect 'nope'; known: no_neginf_guard,"),
    (["verify", "--config", "{}", "--defect", "nope"], {}, "Invalid value for '--defect': unknown defect 'nope'"),
    (["shrink", "--config", "{}", "--defect", "nope"], {}, "Invalid value for '--defect': unknown defect 'nope'"),
    (["triage"], {}, "Missing argument 'sweep' (see attnsweep triage --help)"),
])
def test_usage_mistakes_are_one_line_exit_2_and_leave_nothing(args, env, start, tmp_path):
    one_line(attnsweep(*args, cwd=tmp_path, env=env), 2, start)
    assert list(tmp_path.iterdir()) == []


def test_a_database_password_is_never_echoed(tmp_path):
    line = one_line(attnsweep("failures", cwd=tmp_path, env={"ATTNSWEEP_DATABASE_URL": "mysql://u:hunter2@h/db"}), 2,
                    "ATTNSWEEP_DATABASE_URL:")
    assert "hunter2" not in line


@pytest.mark.parametrize("command", [["failures", "--db"], ["triage", "1", "--db"], ["run", "--backend", "cpu", "--db"],
                                     ["db", "upgrade", "--db"]])
def test_a_database_that_cannot_be_reached_is_exit_3(command, tmp_path):
    url = f"postgresql://u@127.0.0.1:{closed_port()}/x"
    line = one_line(attnsweep(*command, url, cwd=tmp_path), 3, f"--db: the database {url} cannot be reached:")
    assert "Connection refused" in line and line.rstrip().endswith("try again later")


@pytest.mark.parametrize("command", [["serve"], ["submit", "--backend", "cpu", "--samples", "1"]])
def test_the_service_commands_name_the_setting_of_a_database_down(command, tmp_path):
    url = f"postgresql://u@127.0.0.1:{closed_port()}/x"
    one_line(attnsweep(*command, cwd=tmp_path, env={"ATTNSWEEP_DATABASE_URL": url}), 3,
             f"ATTNSWEEP_DATABASE_URL: the database {url} cannot be reached:")


@pytest.mark.parametrize("command", [["failures"], ["failures", "3", "--json"], ["triage", "999"], ["compare", "1", "2"]])
def test_a_read_command_in_an_empty_folder_creates_no_database(command, tmp_path):
    one_line(attnsweep(*command, cwd=tmp_path), 2,
             "the default database (--db to name one): no database at 'attnsweep.db' (run `attnsweep run` first)")
    assert list(tmp_path.iterdir()) == []
    one_line(attnsweep(*command, "--db", "sub.db", cwd=tmp_path), 2, "--db: no database at 'sub.db'")
    assert list(tmp_path.iterdir()) == []


def test_a_read_command_does_not_migrate_an_older_schema(tmp_path):
    from store.migrate import upgrade

    def revision() -> str:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]

    db = tmp_path / "old.db"
    upgrade(f"sqlite:///{db}", "0001")
    before = revision()
    one_line(attnsweep("failures", "--db", str(db), cwd=tmp_path), 2,
             f"--db: the database sqlite:///{db} is not at the newest schema revision (`attnsweep db upgrade --db {db}`")
    assert revision() == before


def test_help_documents_the_exit_status(tmp_path):
    proc = attnsweep("--help", cwd=tmp_path, env={"COLUMNS": "400"})
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "Exit status: 0 pass; 1 failing configs" in text and "2 usage mistake" in text
    assert "3 infrastructure (database, broker or device unavailable" in text and "130 interrupted" in text


def test_ctrl_c_on_run_says_what_was_stored_and_exits_130(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSWEEP_")}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "--backend", "cpu", "--samples", "200", "--seed", "1",
                             "--db", "i.db", "--no-triage"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env={**environ, "PYTHONPATH": str(ROOT), "ATTNSWEEP_PROGRESS_INTERVAL_S": "0"})
    seen = []
    while not any(line.startswith("configs 1/200") for line in seen):
        line = proc.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: interrupted: sweep 1 is stored cancelled with ")
    assert err.rstrip().endswith("of 200 configs run; `attnsweep failures 1` lists what failed so far")
