"""The API under concurrent clients: POST /sweeps of 20-config sampled sweeps and GET /sweeps/{id},
this tree's API against a baseline revision's in the same run (bench/service.py --parts load).
Two loads: clients that send their next request as soon as the last one answered (saturated:
latency is then the queue, clients / throughput), and clients that start a round every `pace`
seconds (20 clients at 1 s: 20 sweeps a second offered).

Each API is a real `attnsweep serve` over a database of its own on the same PostgreSQL and Redis
(no workers: the sweeps stay queued, so only the API's own work is timed). The baseline is the
revision's files (`git archive REV`) run from a temporary folder with the same venv. Phases
alternate baseline, this tree, baseline, ... so a machine whose load changes meanwhile weighs on
both alike. In each phase every client submits a sweep, reads it back, and again, `rounds` times;
latencies are client-side (request sent to response read), on this machine.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tarfile
import io
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness import ServiceStack


@dataclass
class Latencies:
    post: list[float] = field(default_factory=list)
    get: list[float] = field(default_factory=list)
    errors: int = 0


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def export_revision(root: Path, rev: str, dest: Path) -> Path:
    """The files of `rev` (git archive) in dest."""
    blob = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


async def _client(base: str, headers: dict[str, str], k: int, clients: int, rounds: int, out: Latencies, body: dict,
                  pace: float) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as http:
        await asyncio.sleep(pace * k / max(clients, 1))   # paced clients spread over the first round
        next_at = time.perf_counter()
        for r in range(rounds):
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            next_at = time.perf_counter() + pace
            t0 = time.perf_counter()
            resp = await http.post("/sweeps", json={**body, "seed": 1000 * k + r})
            out.post.append(time.perf_counter() - t0)
            if resp.status_code != 202:
                out.errors += 1
                continue
            t0 = time.perf_counter()
            got = await http.get(f"/sweeps/{resp.json()['id']}")
            out.get.append(time.perf_counter() - t0)
            out.errors += got.status_code != 200


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(stack: ServiceStack, clients: int, rounds: int, out: Latencies, pace: float = 0.0) -> tuple[float, float]:
    """One phase against `stack`'s API; returns its wall time and the API process's CPU time."""
    body = {"samples": 20, "backend": "cpu", "label": "bench-load"}
    cpu0, t0 = cpu_seconds(stack.api.pid), time.perf_counter()

    async def main() -> None:
        await asyncio.gather(*(_client(stack.url(""), stack.headers, k, clients, rounds, out, body, pace) for k in range(clients)))

    asyncio.run(main())
    return time.perf_counter() - t0, cpu_seconds(stack.api.pid) - cpu0


def compare(stacks: dict[str, ServiceStack], clients: int, rounds: int, phases: int,
            pace: float) -> list[tuple[str, str, str]]:
    """Rows for bench/service.py's report, saturated and paced: p50/p95/p99 per endpoint per API,
    the API process's CPU time per round, and how loaded the machine was (load average over one
    minute, before and after)."""
    for stack in stacks.values():   # warm each once (first imports, first connections)
        load(stack, 2, 2, Latencies())
    rows = []
    for mode, every in (("saturated", 0.0), (f"one round every {pace:g} s", pace)):
        rows += _measure(stacks, clients, rounds, phases, every, mode)
    return rows


def _measure(stacks: dict[str, ServiceStack], clients: int, rounds: int, phases: int, pace: float,
             mode: str) -> list[tuple[str, str, str]]:
    got = {name: Latencies() for name in stacks}
    walls = {name: 0.0 for name in stacks}
    cpus = {name: 0.0 for name in stacks}
    before = os.getloadavg()[0]
    for _ in range(phases):
        for name, stack in stacks.items():
            wall, cpu = load(stack, clients, rounds, got[name], pace)
            walls[name] += wall
            cpus[name] += cpu
    after = os.getloadavg()[0]
    rows = []
    for endpoint in ("post", "get"):
        label = "POST /sweeps (20 sampled configs)" if endpoint == "post" else "GET /sweeps/{id}"
        for name in stacks:
            xs = getattr(got[name], endpoint)
            rows.append((f"{label}, {clients} clients, {mode}: {name}",
                         f"p50 {statistics.median(xs) * 1e3:.0f} / p95 {percentile(xs, 0.95) * 1e3:.0f} / "
                         f"p99 {percentile(xs, 0.99) * 1e3:.0f} ms",
                         f"{len(xs)} requests, {got[name].errors} errors, {len(xs) / walls[name]:.1f}/s"))
    for name in stacks:
        n = len(got[name].post)
        rows.append((f"API process CPU per POST + GET, {mode}: {name}", f"{cpus[name] / max(n, 1) * 1e3:.1f} ms",
                     f"{cpus[name]:.1f} s over {walls[name]:.0f} s"))
    rows.append(("machine while measured", f"load average {before:.2f} -> {after:.2f}", f"{os.cpu_count()} CPUs"))
    return rows
