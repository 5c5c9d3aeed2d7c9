"""tools/evidence/triage_table.py on the JSON of a real `attnsweep triage --json`: a cpu sweep
with one defect switch, triaged with one cluster shrunk, then tabulated as the GPU steps' lines
are.

    .venv/bin/python -m pytest tools/tests      (make tools-test)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "evidence" / "triage_table.py"
ROOT = TOOL.parents[2]


def test_a_triaged_defect_becomes_one_table_row_per_cluster(tmp_path):
    db = tmp_path / "t.db"
    subprocess.run([sys.executable, "-m", "cli", "run", "--backend", "cpu", "--samples", "40", "--seed", "7",
                    "--jobs", "1", "--defect", "causal_off_by_one", "--no-triage", "--fail-on", "error", "--db", str(db)],
                   cwd=ROOT, check=True, capture_output=True)
    env = os.environ | {"ATTNSWEEP_TRIAGE_CLUSTERS": "1", "ATTNSWEEP_TRIAGE_SHRINK_SECONDS": "10"}
    triage = json.loads(subprocess.run([sys.executable, "-m", "cli", "triage", "1", "--db", str(db), "--json"],
                                       cwd=ROOT, check=True, capture_output=True, text=True, env=env).stdout)
    lines = tmp_path / "triage.jsonl"
    lines.write_text(json.dumps({"defect": "causal_off_by_one", "triage": triage}) + "\n")
    out = subprocess.run([sys.executable, str(TOOL), str(lines)], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    clusters = triage["clusters"]
    failing = sum(c["size"] for c in clusters)
    assert out[0] == f"### causal_off_by_one: {failing} failing configs, {len(clusters)} cluster(s)"
    rows = [line for line in out if line.startswith("| ") and not line.startswith("| size")]
    assert len(rows) == len(clusters) >= 1
    first = clusters[0]
    assert rows[0].startswith(f"| {first['size']} | {first['signature']['outcome']}/")
    assert first["explanation"]["summary"] in rows[0]
    shrunk = first["minimal_config"]
    assert f"k {shrunk['seq_len_k']} q {shrunk['seq_len_q']} g {shrunk['g']}" in rows[0]
    assert rows[0].rstrip(" |").endswith(")") and first["classification"]["kind"] in rows[0]
