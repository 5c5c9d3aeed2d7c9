"""A fetched commit's kernels on the GPU, confined (isolation/): what the confinement lets the
process see and how a faulting and a hanging kernel end. Prints one JSON line per check.

    python3 tools/evidence/confined_cuda.py [--backend cuda]

- the confinement mode the host allows (isolation.sandbox.check) and the process's uid, groups,
  capabilities, what of the host's files and environment it sees, whether it reaches the network;
- three configs of the shipped kernels as a bundle: confined, their outcomes and seconds, against
  the same configs unconfined;
- the bundle with ATTN_DEFECT_OOB_STORE (an illegal address): `fault`, and the next config passes
  on a new process; with ATTN_DEFECT_HANG: `timeout` within the limit.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attnconfig import parse_config  # noqa: E402
from isolation.confined import ConfinedBackend  # noqa: E402
from isolation.sandbox import Confinement, check, python_paths  # noqa: E402
from kernels import get_backend  # noqa: E402
from kernels.source import SRC_DIR, KernelSource, local_source  # noqa: E402
from settings import Settings  # noqa: E402
from sweeps.runner import run_config  # noqa: E402

CONFIGS = [
    dict(dtype="f16", g=2, seq_len_q=1, seq_len_k=4096, num_heads_q=32, num_heads_kv=8, head_dim_qk=128,
         head_dim_v=128, return_lse=True, split_kv=8),
    dict(dtype="bf16", g=1, seq_len_q=64, seq_len_k=1000, num_heads_q=8, num_heads_kv=8, head_dim_qk=64,
         head_dim_v=64, causal=True, return_lse=True, split_kv=4),
    dict(dtype="i8", g=1, seq_len_q=4, seq_len_k=333, num_heads_q=4, num_heads_kv=2, head_dim_qk=80, head_dim_v=48),
]
PROBE = """
import json, os, socket
seen = {p: os.path.exists(p) for p in ('/etc/shadow', '/root', '/home', '/var/lib', os.path.expanduser('~/.cache'))}
try:
    socket.create_connection(('127.0.0.1', 22), timeout=2); net = 'connected'
except OSError as e:
    net = type(e).__name__
status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)
print(json.dumps({'uid': os.getuid(), 'groups': os.getgroups(), 'CapEff': status['CapEff'], 'NoNewPrivs': status.get('NoNewPrivs'),
                  'attnsweep_env': sorted(k for k in os.environ if k.startswith('ATTNSWEEP')), 'sees': seen, 'network': net,
                  'dev': sorted(os.listdir('/dev'))}))
"""


def bundle(*defines: str) -> KernelSource:
    files = {**local_source().files, "host_emu.h": (SRC_DIR / "host_emu.h").read_text()}
    head, sep, rest = files["attention.hip"].partition('#include "hip_compat.h"')
    files["attention.hip"] = head + "".join(f"#define ATTN_DEFECT_{d}\n" for d in defines) + sep + rest + "\n// confined\n"
    return KernelSource.from_files(files)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="cuda")
    args = parser.parse_args()
    settings = Settings(config_time_limit_s=30, config_time_grace_s=0)
    emit(check="mode", mode=check(settings.bwrap or "bwrap", settings.sandbox_uid, settings.sandbox_gid))

    binds, path = python_paths(("settings",))
    os.environ["ATTNSWEEP_PROBE_SECRET"] = "must-not-reach-the-sandbox"
    c = Confinement.of(settings, gpu=True, read_only=tuple(binds), env={"PYTHONPATH": os.pathsep.join(path)})
    done = c.popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = done.communicate(timeout=120)
    emit(check="inside", rc=done.returncode, seen=json.loads(out) if done.returncode == 0 else err[-2000:])

    configs = [parse_config(c) for c in CONFIGS]
    t0 = time.perf_counter()
    confined = ConfinedBackend(args.backend, frozenset(), bundle(), settings=settings)
    start_s = time.perf_counter() - t0
    plain = get_backend(args.backend)
    for config in configs:
        ours = [run_config(config, plain) for _ in range(2)][-1]
        theirs = [run_config(config, confined) for _ in range(2)][-1]
        emit(check="config", config=config.content_hash(), unconfined=[ours.outcome, ours.timings.get("total_s")],
             confined=[theirs.outcome, theirs.timings.get("total_s")], run_wall_s=[ours.timings.get("run_wall_s"),
                                                                                    theirs.timings.get("run_wall_s")])
    emit(check="start", seconds=start_s, device=confined.device_info().device)
    confined.close()
    plain.close()

    oob = ConfinedBackend(args.backend, frozenset(), bundle("OOB_STORE"), settings=settings)
    faulted = run_config(configs[0], oob)
    after = run_config(parse_config({**CONFIGS[0], "split_kv": 1}), oob)
    emit(check="oob_store", outcome=faulted.outcome, detail=faulted.detail[:300], next_outcome=after.outcome,
         processes=oob.started)
    oob.close()

    hang = ConfinedBackend(args.backend, frozenset(), bundle("HANG"), settings=settings, time_limit_s=20)
    hang.prepare(configs[0])
    t0 = time.perf_counter()
    hung = run_config(configs[0], hang)
    emit(check="hang", outcome=hung.outcome, seconds=time.perf_counter() - t0, detail=hung.detail[:200])
    hang.close()


if __name__ == "__main__":
    main()
