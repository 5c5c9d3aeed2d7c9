"""Reading compute-sanitizer's reports, and who may ask for them."""
from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from isolation.sanitize import check_request, parse_findings

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 2 bytes
=========     at void attn_splitkv_combine<__half, float, (int)256>(const float *, const float *, __half *, float *, int, int, int, int, long long, long long, long long, long long, int, int)+0x8f0
=========     by thread (0,0,0) in block (11,0,0)
=========     Address 0x7f1c3a000e16 is out of bounds
=========
ATTNSWEEP-SANITIZED-RESULT {"outcome": "fault"}
========= ERROR SUMMARY: 32 errors
"""
RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void attn_splitkv_combine<float, float, (int)256>(...)+0x4f0
=========     and Read access at void attn_splitkv_combine<float, float, (int)256>(...)+0x560 [1024 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""
CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
# compute-sanitizer 2025.3.1's racecheck on an H100, as it printed them (the singular "hazard",
# the result line between the reports and the summary): docs/evidence/gpu-2026-12-06-h100-faults.tar.xz.
EVIDENCE = Path(__file__).resolve().parents[3] / "docs" / "evidence" / "gpu-2026-12-06-h100-faults.tar.xz"


def _evidence(name: str) -> str:
    with tarfile.open(EVIDENCE) as tar:
        return tar.extractfile(f"gpu-2026-12-06-h100-faults/{name}").read().decode()


def test_findings_are_counted_from_the_summaries_and_the_first_reports_kept():
    count, reports = parse_findings(MEMCHECK)
    assert count == 32
    assert reports[0] == "Invalid __global__ write of size 2 bytes"
    assert "Address 0x7f1c3a000e16 is out of bounds" in reports and not any("SUMMARY" in r for r in reports)
    count, reports = parse_findings(RACECHECK)
    assert count == 1   # the warning is shown, not counted
    assert reports[0].startswith("Error: Race reported between Write access")
    assert parse_findings(CLEAN) == (0, [])


def test_racecheck_output_of_a_real_run_is_read():
    race = _evidence("racecheck-raw-missing_barrier.txt")
    count, reports = parse_findings(race)
    assert count == 1
    assert reports[0].startswith("Error: Race reported between Write access at void attn_splitkv_combine")
    assert not any(r.startswith("ATTNSWEEP-SANITIZED-RESULT") for r in reports)
    assert parse_findings(_evidence("racecheck-raw-clean.txt")) == (0, [])


@pytest.mark.parametrize("tool, backend, share, rule", [
    ("memcheck", "cpu", 1.0, "the cpu backend emulates the kernels in numpy"),
    ("racecheck", "hip", 1.0, "unsupported on hip"),
    ("leakcheck", "cuda", 1.0, "'leakcheck' is not a compute-sanitizer tool"),
    ("memcheck", "cuda", 0.0, "sanitize_share: 0 must be in (0, 1]"),
])
def test_a_request_that_cannot_run_is_refused_in_one_line(tool, backend, share, rule):
    with pytest.raises(ValueError, match=rule.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        check_request(tool, backend, share)


def test_cuda_and_auto_may_ask():
    for backend in ("cuda", "auto"):
        check_request("racecheck", backend, 0.25)
    check_request(None, "cpu")
