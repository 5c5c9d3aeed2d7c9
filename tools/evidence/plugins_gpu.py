"""Kernel plug-ins swept on a GPU (docs/plugins.md, "Proof"): every shipped plug-in, the Triton
example with and without its defect switch and the C-ABI example's CUDA build, each a default
sweep of the same seed, its failures triaged, then the sweeps side by side. Run by
tools/evidence/plugins_gpu.sh, which installs what it needs first; one call of about 9 minutes.

    python3 tools/evidence/plugins_gpu.py --out DIR [--deadline-s 500] [--samples 2000] [--jobs 16]

Writes to DIR: plugins.md (one table: kernel, version, configs run, outcomes, not_applicable
reasons with counts, configs/s; then each failing cluster of each kernel: its explanation,
shrunk reproducer, the reproducer's config against an independent float64 computation, and a
first verdict to check), plugins.json (all of it, the comparison of `attnsweep compare`
included) and logs/ (each command's output). A sweep is cut to fewer configs when the deadline
would not hold the planned count; the table says so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (kernel, share of --samples, triage its failures): the defect's sweep first (the triage proof),
# the library kernels, then the examples; CABI is the C-ABI example's CUDA build (--cabi).
CABI = "/tmp/cabi/libsplitkv_cuda.so"
PLAN = [
    ("triton-splitkv-defect", 0.3, True),
    ("torch-sdpa:math", 1.0, True),
    ("torch-sdpa:flash", 1.0, True),
    ("torch-sdpa:efficient", 1.0, True),
    ("torch-sdpa:cudnn", 1.0, True),
    ("xformers-splitk", 1.0, True),
    ("triton-splitkv", 1.0, True),
    (f"so:{CABI}", 1.0, True),
]
TRIAGE = ["--max-clusters", "3", "--max-runs", "40", "--max-seconds", "12", "--time-limit", "20"]
START_RATE = 30.0   # configs/s assumed before a sweep has measured one


def run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    with log.open("w") as f:
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=max(timeout, 1), cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.monotonic() - t0


def float64_check(config: dict[str, Any], kernel: str, backend_name: str = "cuda") -> dict[str, Any]:
    """The config's output from the kernel, from attnsweep's reference and from an independent
    float64 computation (torch, on the CPU, masks built here); the largest differences of each
    against the float64 one, relative to max|O|, and of the LSEs."""
    import numpy as np
    import torch

    from attnconfig import parse_config
    from isolation.confined import backend_for
    from reference import attention_exact, make_inputs

    c = parse_config(config)
    inputs = make_inputs(c)
    f64 = {k: torch.from_numpy(np.asarray(inputs[k], dtype=np.float64)) for k in ("q", "k", "v")}
    k, v = (f64[n].repeat_interleave(c.gqa_ratio, dim=1) for n in ("k", "v"))
    logits = f64["q"] @ k.transpose(-1, -2) * ((1.0 / c.head_dim_qk ** 0.5) if c.with_attn_scale else 1.0)
    if c.with_attn_bias:
        logits = logits + torch.from_numpy(np.asarray(inputs["bias"], dtype=np.float64))
    keys = torch.arange(c.seq_len_k)
    for b in range(c.g):
        last = c.current_seq_len[b] if c.current_seq_len is not None else c.seq_len_k - 1
        limit = torch.full((c.seq_len_q,), last)
        if c.causal:
            limit = torch.minimum(limit, torch.arange(c.seq_len_q) + (c.prefix_offset[b] if c.prefix_offset else 0))
        logits[b][:, keys[None, :] > limit[:, None]] = float("-inf")
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.softmax(logits, dim=-1) @ v
    scale = float(out.abs().max()) or 1.0
    ref_out, ref_lse = attention_exact(c, inputs)
    found: dict[str, Any] = {"reference_vs_float64": float(np.abs(ref_out - out.numpy()).max() / scale),
                             "reference_lse_vs_float64": float(np.abs(ref_lse - lse.numpy()).max())}
    backend = backend_for(backend_name, kernel=kernel)
    try:
        got = backend.run(backend.prepare(c), c, inputs)
        found["kernel_vs_float64"] = float(np.abs(got.out.astype(np.float64) - out.numpy()).max() / scale)
        if got.lse is not None:
            found["kernel_lse_vs_float64"] = float(np.abs(got.lse.astype(np.float64) - lse.numpy()).max())
        found["kernel_nonfinite"] = int((~np.isfinite(got.out.astype(np.float64))).sum())
    except Exception as exc:  # noqa: BLE001 - what the kernel did is the finding
        found["kernel_raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        backend.close()
    ref_ok = found["reference_vs_float64"] < 1e-6 and found["reference_lse_vs_float64"] < 1e-6
    kernel_off = found.get("kernel_vs_float64", 0.0) > 1e-2 or found.get("kernel_lse_vs_float64", 0.0) > 1e-2 \
        or found.get("kernel_nonfinite", 0) > 0 or "kernel_raised" in found
    found["first_verdict"] = (
        "the reference and an independent float64 computation disagree: check the reference or the gate" if not ref_ok
        else "the kernel is far from float64 where the reference agrees with it: a bug in the kernel, or a semantic "
             "difference its plug-in must map (the cluster's explanation says where)" if kernel_off
        else "the kernel is near float64 at this reproducer: compare its error with the gate (a gate too tight, or "
             "an error just over it)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=500.0)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kernels", default="", help="comma-separated subset of the plan")
    parser.add_argument("--backend", default="cuda", help="cuda; cpu tries the driver where no GPU is")
    parser.add_argument("--cabi", default=CABI, help="the C-ABI example's library")
    args = parser.parse_args()
    began = time.monotonic()
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    db = "/tmp/plugins.db"
    Path(db).unlink(missing_ok=True)
    cli = [sys.executable, "-m", "cli"]
    plan = [(f"so:{args.cabi}" if k == f"so:{CABI}" else k, share, t) for k, share, t in PLAN]
    plan = [p for p in plan if not args.kernels or p[0] in args.kernels.split(",")]
    rows: list[dict[str, Any]] = []
    rate = START_RATE
    for i, (kernel, share, triage) in enumerate(plan):
        left = args.deadline_s - (time.monotonic() - began)
        budget = left / (len(plan) - i)
        planned = max(1, int(args.samples * share))
        samples = min(planned, max(100, int(budget * 0.7 * rate)))
        tag = kernel.replace("/", "_").replace(":", "_")
        report = Path(f"/tmp/report_{tag}.json")
        code, wall = run([*cli, "run", "--kernel", kernel, "--backend", args.backend, "--samples", str(samples), "--seed",
                          str(args.seed), "--jobs", str(args.jobs), "--time-limit", "60", "--no-triage", "--db", db,
                          "--report-json", str(report)], logs / f"run_{tag}.txt", budget * 0.8)
        row: dict[str, Any] = {"kernel": kernel, "planned": planned, "samples": samples, "exit": code, "wall_s": wall}
        if report.exists():
            r = json.loads(report.read_text())
            row.update({k: r.get(k) for k in ("sweep_id", "kernel_version", "outcomes", "not_applicable_reasons",
                                              "configs_run", "configs_per_s", "device")})
            row["name"] = r.get("kernel")
            if r.get("configs_per_s"):
                rate = max(5.0, float(r["configs_per_s"]))
        failing = sum(n for o, n in (row.get("outcomes") or {}).items() if o not in ("pass", "not_applicable"))
        if triage and failing and row.get("sweep_id"):
            left = args.deadline_s - (time.monotonic() - began)
            out = Path(f"/tmp/triage_{tag}.json")
            with out.open("w") as f:
                try:
                    subprocess.run([*cli, "triage", str(row["sweep_id"]), "--db", db, *TRIAGE, "--json"], stdout=f,
                                   stderr=(logs / f"triage_{tag}.txt").open("w"), cwd=ROOT,
                                   timeout=max(10, min(120, left / (len(plan) - i))))
                except subprocess.TimeoutExpired:
                    pass
            try:
                clusters = json.loads(out.read_text()).get("clusters", [])
            except (json.JSONDecodeError, OSError):
                clusters = []
            row["clusters"] = []
            for cluster in clusters[:3]:
                entry = {k: cluster.get(k) for k in ("signature", "size", "reproducer", "minimal_config", "classification")}
                entry["explanation"] = (cluster.get("explanation") or {}).get("summary")
                config = cluster.get("minimal_config") or cluster.get("example_config")
                if config and args.deadline_s - (time.monotonic() - began) > 30:
                    try:
                        entry["float64"] = float64_check(config, kernel, args.backend)
                    except Exception as exc:  # noqa: BLE001
                        entry["float64"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                row["clusters"].append(entry)
        rows.append(row)
        (args.out / "plugins.json").write_text(json.dumps({"sweeps": rows}, indent=1, default=str))
    ids = [str(r["sweep_id"]) for r in rows if r.get("sweep_id") and r["kernel"] != "triton-splitkv-defect"]
    compare = {}
    if len(ids) >= 2:
        done = subprocess.run([*cli, "compare", *ids, "--db", db, "--json", "--limit", "50"], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)
        compare = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-2000:]}
    (args.out / "plugins.json").write_text(json.dumps({"sweeps": rows, "compare": compare}, indent=1, default=str))
    (args.out / "plugins.md").write_text(markdown(rows, compare))
    print(markdown(rows, compare))


def markdown(rows: list[dict[str, Any]], compare: dict[str, Any]) -> str:
    ratio = {r["id"]: r for r in compare.get("sweeps", [])} if isinstance(compare, dict) else {}
    lines = ["| kernel | version | configs run | outcomes | not_applicable reasons | configs/s | time / fastest |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        outcomes = ", ".join(f"{o} {n}" for o, n in sorted((r.get("outcomes") or {}).items(), key=lambda kv: -kv[1]) if n)
        reasons = ", ".join(f"{o} {n}" for o, n in sorted((r.get("not_applicable_reasons") or {}).items(),
                                                         key=lambda kv: -kv[1]))
        cut = f" (of {r['planned']} planned)" if r["samples"] < r["planned"] else ""
        t = ratio.get(r.get("sweep_id"), {}).get("time_ratio_median")
        lines.append(f"| {r.get('name') or r['kernel']} | {r.get('kernel_version') or ''} | {r.get('configs_run')}{cut} "
                     f"| {outcomes} | {reasons} | {r.get('configs_per_s')} | {f'{t:.2f}x' if t else '-'} |")
    for r in rows:
        for i, cl in enumerate(r.get("clusters") or [], 1):
            lines += ["", f"### {r.get('name') or r['kernel']}: cluster {i} ({cl.get('signature')}, {cl.get('size')} configs)",
                      f"- explanation: {cl.get('explanation')}", f"- reproducer: `{cl.get('reproducer')}`",
                      f"- classification: {json.dumps(cl.get('classification'))}",
                      f"- float64: {json.dumps(cl.get('float64'))}"]
    if compare.get("only_one_total") is not None:
        lines += ["", f"configs failing on one kernel only: {compare['only_one_total']} "
                      f"(of {compare.get('common')} in every sweep, {compare.get('ran_by_all')} run by every kernel)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
