"""Markdown tables of `attnsweep triage --json` results, one JSON line per defect switch
({"defect", "triage"}, as tools/evidence/gpu_call.sh's triage steps write them in triage.jsonl).

For each switch: its failing configs, the number of clusters, and per cluster its size,
signature, explanation, the shrunk config's sizes (keys, g, heads, head dims, split_kv), the
runs of the shrink and the classification together, and the classification.

    python3 tools/evidence/triage_table.py triage.jsonl
"""
from __future__ import annotations

import json
import sys


def sizes(c: dict | None) -> str:
    if not c:
        return "-"
    return (f"{c['dtype']} k {c['seq_len_k']} q {c['seq_len_q']} g {c['g']} h {c['num_heads_q']}/{c['num_heads_kv']} "
            f"d {c['head_dim_qk']}/{c['head_dim_v']} s {c['split_kv']}"
            + (" causal" if c.get("causal") else "") + (f" {c['data_regime']}" if c.get("data_regime", "normal") != "normal" else ""))


def signature(s: dict) -> str:
    return "/".join(str(s.get(k)) for k in ("outcome", "gate", "location", "family") if s.get(k) is not None)


def classification(c: dict | None) -> str:
    if not c:
        return "-"
    kind = c.get("kind", "-")
    if c.get("repeats"):
        kind += f" ({c.get('same_input_failing', 0)}/{c['repeats']} same input"
        if c.get("seeds"):
            kind += f", {len(c.get('seeds_failing') or [])}/{len(c['seeds'])} seeds"
        kind += ")"
    return kind


def table(line: dict) -> str:
    t = line["triage"]
    clusters = t.get("clusters") or []
    failing = sum(c["size"] for c in clusters)
    rows = [f"### {line['defect']}: {failing} failing configs, {len(clusters)} cluster(s)", "",
            "| size | signature | explanation | shrunk config | runs | classification |",
            "|---|---|---|---|---|---|"]
    for c in clusters:
        e = c.get("explanation") or {}
        rows.append(f"| {c['size']} | {signature(c['signature'])} | {e.get('summary', '-')} | {sizes(c.get('minimal_config'))} "
                    f"| {c.get('runs', '-')} | {classification(c.get('classification'))} |")
    return "\n".join(rows)


def main() -> None:
    for raw in open(sys.argv[1]):
        if raw.strip():
            print(table(json.loads(raw)), end="\n\n")


if __name__ == "__main__":
    main()
