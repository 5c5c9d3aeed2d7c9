"""tools/evidence/gpu_call.sh's queue: steps run in order under one deadline, a step without
enough time left is skipped and said to be, every step's files come back in one archive, and an
unknown step is refused before anything runs. Only the `env` step runs here (no GPU needed: its
nvidia-smi line fails into env.txt); the tool runs as a command, as the team runs it.

    .venv/bin/python -m pytest tools/tests      (make tools-test)
"""
from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "evidence" / "gpu_call.sh"


def call(tmp_path: Path, *steps: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The tool run from an empty folder (no wheels to install, nothing of the checkout touched);
    its process and its OUT folder."""
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    out.mkdir()
    cwd.mkdir()
    proc = subprocess.run(["bash", str(TOOL), *steps], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | {"OUT": str(out)} | env)
    return proc, out


def test_a_step_runs_and_its_files_come_back_in_one_archive(tmp_path):
    proc, out = call(tmp_path, "env")
    assert proc.returncode == 0, proc.stderr
    lines = (out / "steps.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("env rc ")
    assert sorted(p.name for p in out.iterdir()) == ["evidence.tgz", "steps.txt"]
    with tarfile.open(out / "evidence.tgz") as tar:
        assert "./env.txt" in tar.getnames()


def test_steps_past_the_deadline_are_skipped_and_named(tmp_path):
    proc, out = call(tmp_path, "regimes", "triage:hang", DEADLINE_S="10", MIN_STEP_S="40")
    assert proc.returncode == 0, proc.stderr
    lines = (out / "steps.txt").read_text().splitlines()
    # `regimes` is env, regimes and regime-defects; each step once, in order, none run
    assert [line.split()[0] for line in lines] == ["env", "regimes", "regime-defects", "triage:hang"]
    assert all(" skipped: " in line for line in lines)
    assert not (out / "evidence.tgz").exists()


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path):
    proc, out = call(tmp_path, "env", "benchmarks")
    assert proc.returncode == 2
    assert "unknown step or part benchmarks" in proc.stderr
    assert list(out.iterdir()) == []
