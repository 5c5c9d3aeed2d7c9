"""Configs run under NVIDIA's compute-sanitizer: memory errors and races the numbers may not show.

A sanitized config runs in a child process, `compute-sanitizer --tool TOOL python -m
isolation.sanitize BACKEND`, which runs it through sweeps.runner.run_config exactly as a worker
would and prints its result as one marked JSON line. The sanitizer's findings (an ERROR SUMMARY
or RACECHECK SUMMARY with a non-zero count) make the config `unsafe`, with the first findings
in its detail beside the numeric verdict; a config whose kernel faulted stays `fault`. The tool
is the CUDA toolkit's: only the `cuda` backend has it (ROCm's sanitizers are not integrated),
and the `cpu` emulation runs no kernel to check.

`--sanitize-share P` picks that share of a sweep's configs for it, stratified by kernel variant
(sweeps/plan.py pick_configs: every variant at least once), so a nightly sweep checks every
variant without paying for every config (a sanitized config costs seconds: a process start and
the tool's instrumentation).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from attnconfig import AttentionConfig, parse_config
from isolation.unrun import unrun_result

if TYPE_CHECKING:
    from kernels.backends.base import Backend
    from sweeps.result import ConfigResult

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
RESULT_MARK = "ATTNSWEEP-SANITIZED-RESULT "
FINDINGS_SHOWN = 12      # sanitizer lines kept in a result's detail
# A sanitized config is slower than a plain one by the tool's instrumentation (racecheck most).
TIME_LIMIT_FACTOR = 10.0

_ERRORS = re.compile(r"ERROR SUMMARY:\s+(\d+)\s+error")
# racecheck sums up as "RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)": its
# errors are races; a warning is a hazard it could not prove harmful, shown but not counted.
_RACES = re.compile(r"RACECHECK SUMMARY:\s+\d+\s+hazards?\s+displayed\s+\((\d+)\s+errors?")


def check_request(tool: str | None, backend: str, share: float = 1.0) -> None:
    """ValueError with one line naming what is wrong with a sanitize request, in words that fit
    both the CLI's options and the REST body's fields."""
    if tool is None:
        return
    if tool not in TOOLS:
        raise ValueError(f"sanitize: {tool!r} is not a compute-sanitizer tool; one of {', '.join(TOOLS)}")
    if backend == "cpu":
        raise ValueError("sanitize: the cpu backend emulates the kernels in numpy and runs no GPU code to "
                         "check; only the cuda backend runs under compute-sanitizer")
    if backend == "hostemu":
        raise ValueError("sanitize: the hostemu backend runs the kernels on the CPU and no GPU code to "
                         "check; only the cuda backend runs under compute-sanitizer")
    if backend == "hip":
        raise ValueError("sanitize: unsupported on hip: compute-sanitizer is NVIDIA's, and ROCm's sanitizers "
                         "are not integrated; only the cuda backend runs under compute-sanitizer")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"sanitize_share: {share:g} must be in (0, 1]")


def sanitizer_path() -> str | None:
    """compute-sanitizer: settings.compute_sanitizer (ATTNSWEEP_COMPUTE_SANITIZER), the PATH, or
    the CUDA toolkit's folder."""
    from settings import get_settings

    for candidate in (get_settings().compute_sanitizer, shutil.which("compute-sanitizer"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_findings(output: str) -> tuple[int, list[str]]:
    """(number of errors or hazards the sanitizer summed up, its first report lines)."""
    total = sum(int(m.group(1)) for m in _ERRORS.finditer(output)) + sum(int(m.group(1)) for m in _RACES.finditer(output))
    lines = [ln.removeprefix("=========").strip() for ln in output.splitlines() if ln.startswith("=========")]
    reports = [ln for ln in lines if ln and not ln.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY"))]
    return total, reports[:FINDINGS_SHOWN]


def run_sanitized(config: AttentionConfig, backend: "Backend", gates: dict[str, Any], tool: str,
                  config_time_limit_s: float) -> "ConfigResult":
    """Run `config` in a child process under compute-sanitizer `tool` and judge it, within
    TIME_LIMIT_FACTOR x `config_time_limit_s` (0: no limit)."""
    name = backend.device_info().backend
    try:
        check_request(tool, name)
    except ValueError as exc:
        return unrun_result(config, backend, name, gates, "error", str(exc))
    exe = sanitizer_path()
    if exe is None:
        return unrun_result(config, backend, name, gates, "error",
                            "sanitize: compute-sanitizer not found (set ATTNSWEEP_COMPUTE_SANITIZER or put the "
                            "CUDA toolkit's bin folder on PATH)")
    cmd = [exe, "--tool", tool, "--print-limit", str(FINDINGS_SHOWN), "--error-exitcode", "0",
           sys.executable, "-m", "isolation.sanitize", name]
    payload = json.dumps({"config": config.to_dict(), "gates": gates, "defects": sorted(backend.defects),
                          "kernel": backend.device_info().kernel_spec})
    limit = config_time_limit_s * TIME_LIMIT_FACTOR if config_time_limit_s > 0 else None
    try:
        proc = subprocess.run(cmd, input=payload, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return unrun_result(config, backend, name, gates, "timeout",
                            f"under compute-sanitizer {tool}: exceeded {limit:g} s "
                            f"({TIME_LIMIT_FACTOR:g} x the per-config time limit)")
    output = proc.stdout + "\n" + proc.stderr
    marked = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not marked:
        tail = "\n".join(output.strip().splitlines()[-20:])
        return unrun_result(config, backend, name, gates, "error",
                            f"under compute-sanitizer {tool}: the run stored no result (exit {proc.returncode}):\n{tail}")
    result = _result_of(config, json.loads(marked[-1][len(RESULT_MARK):]))
    count, reports = parse_findings(output)
    result.timings["sanitize_s"] = result.timings.get("total_s", 0.0)
    if count and result.outcome != "fault":
        verdict = f"numeric verdict {result.outcome}" + (f" ({result.failed_gate})" if result.failed_gate else "")
        result.detail = (f"compute-sanitizer {tool}: {count} finding(s); {verdict}\n" + "\n".join(reports)
                         + (f"\n{result.detail}" if result.detail else ""))
        result.outcome = "unsafe"
    elif count:
        result.detail += f"\ncompute-sanitizer {tool}: {count} finding(s)\n" + "\n".join(reports)
    else:
        result.detail = (result.detail + "\n" if result.detail else "") + f"compute-sanitizer {tool}: no findings"
    return result


def _result_of(config: AttentionConfig, data: dict[str, Any]) -> "ConfigResult":
    from sweeps.result import ConfigResult

    fields = {k: v for k, v in data.items() if k in ConfigResult.__dataclass_fields__ and k != "config"}
    return ConfigResult(config=config, **fields)


def _main(backend_name: str) -> None:
    """The child: one config from stdin, its result as one marked JSON line on stdout."""
    from dataclasses import asdict

    from kernels.plugins import kernel_backend
    from sweeps.runner import run_config

    request = json.loads(sys.stdin.read())
    config = parse_config(request["config"])
    backend = kernel_backend(request.get("kernel", "attnsweep"), backend_name, defects=frozenset(request["defects"]))
    result = run_config(config, backend, request["gates"])
    data = asdict(result)
    data.pop("config")
    data["metrics"] = {k: (None if v is None else (v if isinstance(v, (int, str)) else float(v)))
                       for k, v in result.metrics.items()}
    print(RESULT_MARK + json.dumps(data, default=str), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1])
