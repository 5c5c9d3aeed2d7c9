"""The drills' deployment: its own PostgreSQL, Redis, API and two workers (harness/), and what a
drill reads back from the store to fill its table row."""
from __future__ import annotations

import hashlib
import hmac
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import PostgresCluster, RedisServer, ServiceStack, service_env, wait_for

SECRET = "drill-webhook-secret-5b1f0c"
# The drills' own API token (the API refuses requests without one).
API_SECRET = "drills-" + hashlib.sha256(b"attnsweep drills").hexdigest()[:32]
LEASE_S = 30           # ATTNSWEEP_VISIBILITY_TIMEOUT_S for the drills (the minimum)
# A drill's sweep fails when no config of it is stored for STALL_S (past any drill's outage, eight
# leases), not after a fixed time: on a loaded host a sweep that makes progress is slow, not lost.
STALL_S = 240
DONE_CAP_S = 1800      # the longest any drill waits for its sweep, progress or not
CONFIG_LIMIT_S = 20    # per-config time limit: far above a drill config's second, below a freeze
WORKERS = ("drill0", "drill1")
# Small configs: a few tenths of a second of numpy each on one core.
BASE = dict(dtype="f16", g=1, seq_len_q=32, seq_len_k=2048, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=64)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Row:
    drill: str
    total: int = 0
    stored: int = 0
    distinct: int = 0
    duplicated: int = 0
    lost: int = 0
    status: str = "?"
    recovery_s: float | None = None
    note: str = ""
    equal: tuple[int, int] | None = None   # (outcomes equal to the clean run, configs compared)
    reruns_expected: bool = False          # a worker stopped past its lease: its late results arrive too
    failed: str = ""                       # a drill's own check that did not hold

    @property
    def bad(self) -> bool:
        unequal = self.equal is not None and self.equal[0] != self.equal[1]
        duplicated = self.duplicated and not self.reruns_expected
        return bool(self.lost or duplicated or self.status != "done" or unequal or self.failed)


@dataclass
class DrillService:
    base: Path
    pg: PostgresCluster
    redis: RedisServer
    kernel_repo: Path | None = None
    stack: ServiceStack = field(init=False)

    def __post_init__(self) -> None:
        self.stack = ServiceStack(self.env(), self.base, headers={"authorization": f"Bearer {API_SECRET}"})

    def env(self) -> dict[str, str]:
        return service_env(
            self.pg.url, self.redis.url, "drill-", ATTNSWEEP_HEARTBEAT_S="2", ATTNSWEEP_VISIBILITY_TIMEOUT_S=str(LEASE_S),
            ATTNSWEEP_TASK_BATCH_SIZE="4", ATTNSWEEP_WEBHOOK_SECRET=SECRET,
            ATTNSWEEP_API_TOKENS=f"drills:admin:{API_SECRET}",
            ATTNSWEEP_CONFIG_TIME_LIMIT_S=str(CONFIG_LIMIT_S), ATTNSWEEP_CONFIG_TIME_GRACE_S="10",
            ATTNSWEEP_KERNEL_REPO=str(self.kernel_repo or ""), ATTNSWEEP_CI_SAMPLES="40", ATTNSWEEP_CI_BACKEND="cpu",
            ATTNSWEEP_CI_SPEC=json.dumps({"ranges": {"seq_len_k": [1, 1024], "seq_len_q": [1, 16], "g": [1, 2]}}),
            ATTNSWEEP_KERNEL_CACHE=str(self.base / "kernel-cache"), ATTNSWEEP_KERNEL_REPO_CACHE=str(self.base / "repos"))

    # processes
    @property
    def api(self):  # noqa: ANN201
        return self.stack.api

    @property
    def workers(self) -> list:
        return [self.stack.workers[n] for n in sorted(self.stack.workers)]

    def start_api(self) -> None:
        self.stack.env = self.env()   # ATTNSWEEP_KERNEL_REPO may have changed
        self.stack.start_api()

    def start_worker(self, i: int, wait: bool = False, **env: str):  # noqa: ANN201
        return self.stack.start_worker(WORKERS[i], wait=wait, **env)

    def wait_workers_ready(self, timeout: float = 90) -> None:
        for w in self.workers:
            self.stack.wait_ready(w, timeout=timeout)

    def ensure_up(self) -> None:
        """Every worker and the API alive again, as before the drill."""
        for i, w in enumerate(self.workers):
            if not w.alive():
                self.start_worker(i)
        if not self.api.alive():
            self.start_api()
        self.wait_workers_ready()

    # HTTP
    def get(self, path: str) -> tuple[int, Any]:
        return self.stack.get(path)

    def post_sweep(self, n: int, seed: int, timeout: float = 30) -> tuple[int, Any]:
        configs = [{**BASE, "data_seed": seed * 100000 + i} for i in range(n)]
        return self.post_configs(configs, f"drill {seed}", timeout=timeout)

    def post_configs(self, configs: list[dict[str, Any]], label: str, defects: list[str] | None = None,
                     timeout: float = 30) -> tuple[int, Any]:
        return self.stack.request("POST", "/sweeps", {"configs": configs, "backend": "cpu", "label": label,
                                                      "defects": defects or []}, timeout=timeout)

    def deliver(self, payload: dict[str, Any], delivery: str) -> tuple[int, Any]:
        body = json.dumps(payload).encode()
        sig = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        return self.stack.request("POST", "/webhooks/ci", headers={
            "X-GitHub-Event": "push", "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": sig,
            "content-type": "application/json"}, raw_body=body, timeout=60)

    # the store, read directly (the API may be the thing that is down)
    def db(self, sql: str, *args: Any) -> list[tuple]:
        return self.pg.sql(sql, *args)

    def sweep_status(self, sid: int) -> str | None:
        rows = self.db("SELECT status FROM sweeps WHERE id = %s", sid)
        return rows[0][0] if rows else None

    def wait_done(self, sid: int, stall_s: float = STALL_S) -> bool:
        """Whether the sweep ended, waiting while its configs keep being stored: False once none
        was stored for `stall_s` seconds, or after DONE_CAP_S."""
        t0 = last_progress = time.monotonic()
        stored = -1
        while time.monotonic() - t0 < DONE_CAP_S:
            try:
                if self.sweep_status(sid) in ("done", "failed", "cancelled"):
                    return True
                now_stored = self.stored(sid)
            except Exception:  # noqa: BLE001 - a dependency still down: no progress seen
                now_stored = stored
            if now_stored != stored:
                stored, last_progress = now_stored, time.monotonic()
            elif time.monotonic() - last_progress > stall_s:
                log(f"sweep {sid}: no config stored for {stall_s:g} s ({stored} stored)")
                return False
            time.sleep(0.5)
        return False

    def wait_progress(self, sid: int, done: int, timeout: float = 120) -> None:
        wait_for(lambda: self.stored(sid) >= done, timeout, f"{done} configs of sweep {sid} stored", interval=0.3,
                 ignore=(Exception,))

    def stored(self, sid: int) -> int:
        return self.db("SELECT count(*) FROM config_runs WHERE sweep_id = %s AND state = 'done'", sid)[0][0]

    def outcomes(self, sid: int) -> dict[str, str]:
        """Each stored config's outcome by config hash: two sweeps of the same configs compare
        config by config."""
        rows = self.db("SELECT config_hash, outcome FROM config_runs WHERE sweep_id = %s AND state = 'done'", sid)
        return dict(rows)

    def row(self, drill: str, sid: int, t_end: float | None, finished: bool, note: str = "",
            clean: dict[str, str] | None = None) -> Row:
        total = self.db("SELECT configs_total FROM sweeps WHERE id = %s", sid)[0][0]
        stored, distinct, duplicated = self.db(
            "SELECT count(*), count(DISTINCT config_hash), count(*) FILTER (WHERE attempts > 1) "
            "FROM config_runs WHERE sweep_id = %s AND state = 'done'", sid)[0]
        recovery = (time.monotonic() - t_end) if (finished and t_end is not None) else None
        equal = None
        if clean is not None:
            got = self.outcomes(sid)
            equal = (sum(1 for k, v in clean.items() if got.get(k) == v), len(clean))
        return Row(drill, total, stored, distinct, duplicated, total - distinct, self.sweep_status(sid) or "?",
                   recovery, note, equal)
