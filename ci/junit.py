"""A sweep as JUnit XML, the report format CI systems display natively.

One <testcase> per config, in sampled order. fail, nan, fault (the kernel faulted or stored
outside its buffers) and unsafe (compute-sanitizer found a memory error or a race) are
<failure>s: the kernel is wrong. error, timeout and oom are <error>s (no output to judge);
not_applicable, cancelled
and not-yet-run configs are <skipped>. A failure's text holds its metrics, the gates it was
judged by and its one-line reproducer. In a pull request's report a failure the base branch
already had says so in its message.

Once the sweep's triage stored its clusters, failures are reported by bug: the suite's
`attnsweep.summary` property says "2 bugs in 119 failing configs" (a pull request's: "2 new bugs
in ..."), each bug is a `attnsweep.bug.N` property (its signature, size, explanation, minimal
reproducer and, once a CI bisection found it, first bad commit), and each failure's message
starts with the bug it belongs to.
"""
from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from typing import Any, Collection, Iterable, Sequence

from attnconfig.outcomes import METRIC_KEYS
from store.models import Cluster, ConfigRun, Sweep

FAILURES = ("fail", "nan", "fault", "unsafe")
ERRORS = ("error", "timeout", "oom")
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd]")


def _text(value: Any) -> str:
    return _NOT_XML.sub("?", str(value))


def case_name(run: ConfigRun) -> str:
    c = run.config
    shape = (f"{c['dtype']} g{c['g']} q{c['seq_len_q']} k{c['seq_len_k']} h{c['num_heads_q']}/{c['num_heads_kv']} "
             f"d{c['head_dim_qk']}/{c['head_dim_v']} split{c['split_kv']}")
    if c.get("causal"):
        shape += " causal"
    return f"{shape} [{run.config_hash[:12]}]"


def _metric(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _body(run: ConfigRun) -> str:
    metrics = {k: _metric(getattr(run, k)) for k in METRIC_KEYS if getattr(run, k) is not None}
    lines = [
        f"outcome: {run.outcome}" + (f" (gate {run.failed_gate})" if run.failed_gate else ""),
        f"detail: {run.detail or ''}",
        f"metrics: {json.dumps(metrics, sort_keys=True)}",
        f"gates: {json.dumps(run.gates, sort_keys=True) if run.gates else '{}'}",
        f"config: {json.dumps(run.config, sort_keys=True)}",
        f"backend: {run.backend} on {run.device}; compiler {run.compiler_version}; driver {run.driver_version}; "
        f"variant {run.variant}; block_n {run.block_n}; source {run.source_hash}",
        f"kernel: {run.kernel or 'attnsweep'} {run.kernel_version or ''}".rstrip(),
        f"reproducer: {run.reproducer or ''}",
    ]
    return "\n".join(lines)


def _bug_text(number: int, total: int, bug: Cluster) -> str:
    return f"bug {number} of {total} ({bug.explanation.get('text') or bug.signature})"


def render(sweep: Sweep, runs: Iterable[ConfigRun], known: Collection[str] = (), base_sweep_id: int | None = None,
           bugs: Sequence[Cluster] | None = None, summary: str | None = None) -> bytes:
    """The JUnit XML document of `sweep` (runs in sampled order). `bugs`: the sweep's stored
    clusters, largest first (None: not triaged); `summary`: the failures in words
    (ci.verdict.failures_text)."""
    suite = ET.Element("testsuite", name=f"attnsweep sweep {sweep.id}" + (f" {sweep.label}" if sweep.label else ""))
    props = ET.SubElement(suite, "properties")
    for key in ("id", "label", "status", "backend", "kernel", "kernel_name", "kernel_version", "repository", "ref",
                "commit_sha", "event", "base_ref", "source_hash"):
        value = getattr(sweep, key)
        if value is not None:
            ET.SubElement(props, "property", name=f"sweep.{key}", value=_text(value))
    if summary:
        ET.SubElement(props, "property", name="attnsweep.summary", value=_text(summary))
    bug_of: dict[str, str] = {}
    for number, bug in enumerate(bugs or (), 1):
        text = _bug_text(number, len(bugs), bug)
        ET.SubElement(props, "property", name=f"attnsweep.bug.{number}",
                      value=_text(f"{bug.signature}, {bug.size} failing configs: {bug.explanation.get('summary', '')}; "
                                  f"minimal reproducer: {bug.reproducer or '-'}"
                                  + (f"; first bad commit {bug.first_bad_commit}" if bug.first_bad_commit else "")))
        for h in bug.config_hashes:
            bug_of[h] = text
    tally = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_s = 0.0
    for run in runs:
        tally["tests"] += 1
        case = ET.SubElement(suite, "testcase", classname=f"attnsweep.{run.config['dtype']}", name=_text(case_name(run)))
        if run.kernel:   # the kernel that ran it (kernels/plugins), name and version
            case.set("kernel", _text(f"{run.kernel} {run.kernel_version or ''}".strip()))
        if run.total_s is not None and math.isfinite(run.total_s):
            case.set("time", f"{run.total_s:.3f}")
            total_s += run.total_s
        if run.state != "done":
            tally["skipped"] += 1
            ET.SubElement(case, "skipped", message="cancelled" if run.state == "cancelled" else "not run yet")
        elif run.outcome == "not_applicable":
            tally["skipped"] += 1
            ET.SubElement(case, "skipped", message=_text(f"not applicable: {run.not_applicable_reason}"))
        elif run.outcome in FAILURES or run.outcome in ERRORS:
            kind = "failure" if run.outcome in FAILURES else "error"
            tally["failures" if kind == "failure" else "errors"] += 1
            first = run.detail.splitlines()[0] if run.detail else run.outcome
            # The detail names its gate already ("row: out_row_err=..."): said once.
            named = run.failed_gate and not first.startswith(f"{run.failed_gate}:")
            message = f"{run.failed_gate}: {first}" if named else first
            if run.config_hash in bug_of:
                message = f"{bug_of[run.config_hash]}: {message}"
            if run.config_hash in known:
                message = f"known on the base branch (sweep {base_sweep_id}): {message}"
            element = ET.SubElement(case, kind, type=run.outcome, message=_text(message[:1000]))
            element.text = _text(_body(run))
    for key, value in tally.items():
        suite.set(key, str(value))
    suite.set("time", f"{total_s:.3f}")
    root = ET.Element("testsuites", name="attnsweep", time=f"{total_s:.3f}", **{k: str(v) for k, v in tally.items()})
    root.append(suite)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)
