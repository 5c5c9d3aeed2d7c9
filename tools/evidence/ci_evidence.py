"""GPU evidence for CI integration: a pull request that breaks the kernels fails its check, the fix passes.

    python tools/evidence/ci_evidence.py --out $OUT [--backend cuda] [--samples 300] [--defect floor_blocks_per_split]
    python tools/evidence/ci_evidence.py --out $OUT --backend hostemu --edit grouped_last_key --spec '{...}'

In a temporary git repository holding kernels/ copied from this checkout it commits
  A  the kernels as they are, on main;
  B  on a branch, a defect switch turned on in the source (`#define ATTN_DEFECT_<NAME> 1`);
  C  on the same branch, the switch removed again (the fix);
and sends the service, in-process (FastAPI's TestClient over SQLite; broker: kombu's in-memory
transport), the signed webhook deliveries a code host would: a push of A to main, then a
pull_request event for B and one for C (base: main). After each delivery the tasks the API
published are taken off the in-memory queue and run by the worker's own code
(workers.execute.execute_batch) in --jobs local processes, on --backend. On cuda the defect comes
from the compiled source itself; on cpu (to check the script without a GPU) the emulation reads
the switch from the bundle's #define lines. With --edit NAME, B makes a hand-made change of
tests/unit/ci/hooks.py HAND_EDITS instead (no switch: the kernels' arithmetic edited) and C
restores A's source; the hostemu backend runs the source itself on the CPU and must fail B, the
cpu backend's numpy model cannot see it (--expect-b pass states that). It prints each verdict and B's new failures, redelivers
B's delivery to show the replay starts nothing, and writes summary.json and B's JUnit XML under
--out. Exit status 0 when B fails with new failures and C passes.

Needs no PostgreSQL, Redis or Celery worker; it imports fastapi, httpx (TestClient), celery and
kombu (the app object and the in-memory broker), as the API does.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.unit.ci.hooks import (  # noqa: E402
    HAND_EDITS,
    KernelRepo,
    deliver,
    hand_edit,
    pr_payload,
    push_payload,
    with_defects,
    without_defects,
)

REPOSITORY = "attnsweep/ci-evidence"
_settings_cache: dict[str, Any] = {}


def _init_job() -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"


def _run_task(settings_json: str, args: list) -> dict[str, int]:
    """One published task, run as a Celery worker would run it (in a spawned process)."""
    from settings import Settings
    from workers.execute import execute_batch

    settings = _settings_cache.get(settings_json)
    if settings is None:
        settings = _settings_cache[settings_json] = Settings.model_validate_json(settings_json)
    sweep_id, items, backend, defects, err_ratio_gate = args
    return execute_batch(settings, sweep_id, items, backend, defects or (), err_ratio_gate, worker=f"evidence-{os.getpid()}")


def _drain(settings: Any) -> list[list]:
    """The args of every task waiting on the in-memory queue of the CI backend."""
    from workers.app import create_celery, queue_kind

    celery = create_celery(settings)
    tasks = []
    with celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(settings.queue_name(queue_kind(settings.ci_backend)), no_ack=True)
        while True:
            try:
                msg = queue.get(block=False)
            except queue.Empty:
                break
            tasks.append(msg.payload[0])
        queue.close()
    return tasks


def _run_published(settings: Any, pool: Any) -> tuple[int, float]:
    tasks = _drain(settings)
    t0 = time.perf_counter()
    payload = settings.model_dump_json()
    for counts in pool.starmap(_run_task, [(payload, t) for t in tasks], chunksize=1):
        assert counts is not None
    return len(tasks), time.perf_counter() - t0


def _brief(failure: dict[str, Any]) -> dict[str, Any]:
    c = failure["config"]
    shape = {k: c[k] for k in ("dtype", "g", "seq_len_q", "seq_len_k", "num_heads_q", "num_heads_kv", "head_dim_qk",
                               "head_dim_v", "split_kv", "causal")}
    return {"config_hash": failure["config_hash"], "outcome": failure["outcome"], "gate": failure["failed_gate"],
            "detail": failure["detail"], "shape": shape, "reproducer": failure["reproducer"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backend", choices=("cuda", "hip", "cpu", "hostemu"), default="cuda")
    ap.add_argument("--samples", type=int, default=300, help="configs per CI sweep (default distribution)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--defect", default="floor_blocks_per_split", help="the switch commit B turns on")
    ap.add_argument("--edit", choices=sorted(HAND_EDITS), default=None,
                    help="B makes this hand-made source change instead of turning a switch on")
    ap.add_argument("--spec", type=json.loads, default={}, help="ATTNSWEEP_CI_SPEC: dtypes, ranges... (JSON)")
    ap.add_argument("--expect-b", choices=("fail", "pass"), default="fail", help="the verdict B must get")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--batch", type=int, default=8, help="configs per task (ATTNSWEEP_TASK_BATCH_SIZE)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from fastapi.testclient import TestClient

    from api.main import create_app
    from settings import Settings
    from kernels.backends.base import DEFECTS
    from store.migrate import upgrade

    if args.defect not in DEFECTS:
        ap.error(f"--defect: one of {', '.join(sorted(DEFECTS))}")
    work = Path(tempfile.mkdtemp(prefix="attnsweep-ci-evidence-"))
    repo = KernelRepo(work / "kernel-repo", full=True)
    a = repo.commit("A: the kernels of this checkout")
    original = repo.entry.read_text()
    change = f"hand edit {args.edit}" if args.edit else args.defect
    if args.edit:
        b = repo.commit(f"B: {change}", hand_edit(args.edit), branch="feature")
        c = repo.commit(f"C: revert {change}", lambda _text: original)
    else:
        b = repo.commit(f"B: turn on {args.defect}", with_defects(args.defect), branch="feature")
        c = repo.commit(f"C: fix {args.defect}", without_defects)
    print(f"kernel repository {repo.path}: A={a[:12]} (main), B={b[:12]} ({change}), C={c[:12]} (feature)", flush=True)

    secret = secrets.token_hex(16)
    db = f"sqlite:///{work / 'attnsweep.db'}"
    upgrade(db)
    settings = Settings(database_url=db, broker_url="memory://", queue_prefix=f"ev{uuid.uuid4().hex[:8]}-",
                        webhook_secret=secret, kernel_repo=str(repo.path), kernel_repo_cache=work / "mirrors",
                        ci_samples=args.samples, ci_backend=args.backend, ci_seed=args.seed, task_batch_size=args.batch,
                        ci_spec=args.spec)
    steps = [("A", "push", a, push_payload(REPOSITORY, "main", a)),
             ("B", "pull_request", b, pr_payload(REPOSITORY, 1, "feature", b, "main", a, action="opened")),
             ("C", "pull_request", c, pr_payload(REPOSITORY, 1, "feature", c, "main", a, action="synchronize"))]
    summary: dict[str, Any] = {"backend": args.backend, "samples": args.samples, "seed": args.seed, "defect": args.defect,
                               "edit": args.edit, "spec": args.spec,
                               "jobs": args.jobs, "commits": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    deliveries: dict[str, str] = {}
    ctx = mp.get_context("spawn")  # a forked child would inherit a broken CUDA context
    with TestClient(create_app(settings)) as client, ctx.Pool(args.jobs, initializer=_init_job) as pool:
        for name, event, sha, payload in steps:
            deliveries[name] = str(uuid.uuid4())
            resp = deliver(client, secret, event, payload, delivery=deliveries[name])
            if resp.status_code != 202:
                raise SystemExit(f"{name}: webhook answered {resp.status_code}: {resp.text}")
            accepted = resp.json()
            tasks, run_s = _run_published(settings, pool)
            status = client.get(f"/ci/{sha}", params={"event": event}).json()
            results = client.get(f"/sweeps/{accepted['sweep_id']}/results", params={"limit": 1}).json()["data"]
            first = results[0] if results else {}
            summary["commits"][name] = {
                "commit_sha": sha, "event": event, "sweep_id": accepted["sweep_id"], "source_hash": accepted["source_hash"],
                "state": status["state"], "verdict": status["verdict"], "configs": status["configs"],
                "failures": status["failures"], "new_failure_count": status["new_failure_count"],
                "known_failure_count": status["known_failure_count"], "base_sweep_id": status["base_sweep_id"],
                "tasks": tasks, "run_s": round(run_s, 1), "configs_per_s": round(status["configs"] / run_s, 2) if run_s else None,
                "device": first.get("device"), "driver_version": first.get("driver_version"),
                "compiler_version": first.get("compiler_version"), "block_n": first.get("block_n"),
                "result_source_hash": first.get("source_hash"),
                "new_failures": [_brief(f) for f in status["new_failures"][:25]],
                "known_failures": [_brief(f) for f in status["known_failures"][:10]],
            }
            print(f"{name} {event:<12} {sha[:12]} verdict={status['verdict']:<5} configs={status['configs']} "
                  f"failures={status['failures']} new={status['new_failure_count']} known={status['known_failure_count']} "
                  f"({tasks} tasks in {run_s:.1f} s)", flush=True)
            for f in status["new_failures"][:10]:
                brief = _brief(f)
                print(f"    new {brief['outcome']}/{brief['gate']}: {json.dumps(brief['shape'])}  {(brief['detail'] or '')[:100]}")
        replay = deliver(client, secret, "pull_request", steps[1][3], delivery=deliveries["B"])
        summary["replay_of_B"] = {"status_code": replay.status_code, "status": replay.json().get("status"),
                                  "sweep_id": replay.json().get("sweep_id"), "tasks_published": len(_drain(settings))}
        print(f"redelivery of B: {replay.status_code} {summary['replay_of_B']['status']} "
              f"(sweep {summary['replay_of_B']['sweep_id']}, {summary['replay_of_B']['tasks_published']} tasks published)")
        (args.out / "junit-B.xml").write_bytes(client.get(f"/sweeps/{summary['commits']['B']['sweep_id']}/junit.xml").content)
        summary["ci_commits"] = client.get("/ci/commits", params={"repository": REPOSITORY}).json()

    got = summary["commits"]
    checks = {
        ("B fails with new failures" if args.expect_b == "fail" else "B passes"):
            got["B"]["verdict"] == args.expect_b and (got["B"]["new_failure_count"] > 0) == (args.expect_b == "fail"),
        "C (the fix) passes": got["C"]["verdict"] == "pass",
        "B's results carry B's bundle hash": got["B"]["result_source_hash"] == got["B"]["source_hash"],
        "A and C are one bundle": got["A"]["source_hash"] == got["C"]["source_hash"] != got["B"]["source_hash"],
        "the replay started nothing": summary["replay_of_B"]["status"] == "replayed"
                                      and summary["replay_of_B"]["tasks_published"] == 0,
    }
    summary["checks"] = checks
    summary["ok"] = all(checks.values())
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"summary: {args.out / 'summary.json'}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
