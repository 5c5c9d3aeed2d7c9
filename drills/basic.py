"""The first drills: processes and dependencies killed or stopped while a sweep runs, and the API
killed between its commit and its publish (docs/service.md, Drills)."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from typing import Any, Callable

from drills.stack import LEASE_S, DrillService, Row
from harness import wait_for


def drill_worker_main_kill(svc: DrillService, n: int) -> Row:
    # A sweep long enough that all ten kills land while it runs.
    status, body = svc.post_sweep(3 * n, 1)
    sid = body["id"]
    svc.wait_progress(sid, 2)
    kills = 0
    for k in range(10):
        i = k % 2
        if svc.sweep_status(sid) == "done":
            break
        svc.workers[i].kill_main()  # the main process only: its pool child is orphaned, as after an OOM kill
        kills += 1
        svc.start_worker(i)  # restarted as a supervisor (compose's restart policy) would
        time.sleep(3)
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("worker main SIGKILL x10", sid, t_end, finished, f"{kills} kills; lease {LEASE_S} s")


# What a killed pool child may cause in its worker's log besides its own loss (WorkerLostError):
# nothing. A batch that failed, or a reconciler pass that failed, means the replacement child
# and its parent shared something they must not (a database session inherited across fork).
COLLATERAL = re.compile(r"raised unexpected|reconciler pass failed")


def drill_pool_child_kill(svc: DrillService, n: int) -> Row:
    logs_from = [len(w.log()) for w in svc.workers]
    status, body = svc.post_sweep(3 * n, 2)
    sid = body["id"]
    svc.wait_progress(sid, 2)
    kills = 0
    for k in range(40):  # ten kills; a worker between two children has none to kill for a moment
        if kills == 10 or svc.sweep_status(sid) == "done":
            break
        children = svc.workers[k % 2].children()
        if children:
            try:
                os.kill(children[0], signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        time.sleep(1.0)
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    row = svc.row("pool child SIGKILL x10", sid, t_end, finished, f"{kills} kills")
    collateral = [line for w, start in zip(svc.workers, logs_from) for line in w.log()[start:].splitlines()
                  if COLLATERAL.search(line)]
    if collateral:
        row.failed = f"{len(collateral)} task or reconciler failures besides the kills, first: {collateral[0][-160:]}"
    return row


def drill_redis_kill(svc: DrillService, n: int) -> Row:
    status, body = svc.post_sweep(n, 3)
    sid = body["id"]
    svc.wait_progress(sid, 4)
    svc.redis.kill()
    time.sleep(3)
    svc.redis.start()
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("Redis SIGKILL, restart", sid, t_end, finished, "down 3 s, AOF on")


def drill_postgres_stop(svc: DrillService, n: int) -> Row:
    status, body = svc.post_sweep(n, 4)
    sid = body["id"]
    svc.wait_progress(sid, 4)
    svc.pg.stop()
    t0 = time.monotonic()
    codes = set()
    while time.monotonic() - t0 < 20:
        codes.add(svc.get("/sweeps")[0])
        time.sleep(2)
    svc.pg.start()
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("PostgreSQL stop 20 s", sid, t_end, finished, f"API answered {sorted(codes)} meanwhile")


def _kill_api_after_commit(svc: DrillService, start: Callable[[], Any], sweeps_before: int) -> int:
    """Freeze Redis, start a submission in a thread, SIGKILL the API once its sweep is committed."""
    svc.redis.freeze()
    threading.Thread(target=lambda: _swallow(start), daemon=True).start()
    sid = wait_for(lambda: (svc.db("SELECT max(id) FROM sweeps")[0][0] or 0) > sweeps_before
                   and svc.db("SELECT max(id) FROM sweeps")[0][0], 60, "the sweep to be committed", interval=0.05)
    svc.api.kill_main()
    return sid


def _swallow(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - the API is killed under it on purpose
        pass


def drill_api_kill_rest(svc: DrillService, n: int) -> Row:
    before = svc.db("SELECT coalesce(max(id), 0) FROM sweeps")[0][0]
    sid = _kill_api_after_commit(svc, lambda: svc.post_sweep(n, 5, timeout=60), before)
    unpublished = svc.db("SELECT count(*) FROM config_runs WHERE sweep_id = %s AND enqueued_at IS NULL", sid)[0][0]
    svc.redis.thaw()
    t_end = time.monotonic()
    svc.start_api()
    finished = svc.wait_done(sid)
    return svc.row("API SIGKILL after commit (REST)", sid, t_end, finished, f"{unpublished} unpublished at the kill")


def drill_api_kill_webhook(svc: DrillService, n: int) -> Row:
    from tests.unit.ci.hooks import KernelRepo, push_payload

    repo = KernelRepo(svc.base / f"kernels-{uuid.uuid4().hex[:6]}")
    sha = repo.commit("drill")
    # The API reads ATTNSWEEP_KERNEL_REPO at start: restart it on this repository.
    svc.kernel_repo = repo.path
    svc.api.stop()
    svc.start_api()
    payload = push_payload("drill/kernels", "main", sha)
    delivery = str(uuid.uuid4())
    before = svc.db("SELECT coalesce(max(id), 0) FROM sweeps")[0][0]
    sid = _kill_api_after_commit(svc, lambda: svc.deliver(payload, delivery), before)
    svc.redis.thaw()
    t_end = time.monotonic()
    svc.start_api()
    redelivered = svc.deliver(payload, delivery)
    new_id = svc.deliver(payload, str(uuid.uuid4()))  # the same signed body, a new delivery id
    finished = svc.wait_done(sid)
    code, ci = svc.get(f"/ci/{sha}")
    note = (f"redelivery {redelivered[0]} {redelivered[1].get('status')}, new delivery id {new_id[0]} "
            f"{new_id[1].get('status')}; /ci verdict {ci.get('verdict') if code == 200 else code}")
    row = svc.row("API SIGKILL after commit (webhook)", sid, t_end, finished, note)
    if redelivered[1].get("sweep_id") != sid or new_id[1].get("sweep_id") != sid:
        row.note += "; A REPLAY STARTED ANOTHER SWEEP"
    return row


def drill_post_redis_down(svc: DrillService, n: int) -> Row:
    svc.redis.kill()
    t0 = time.monotonic()
    code, body = svc.post_sweep(n, 7)
    took = time.monotonic() - t0
    sid = body["id"]
    time.sleep(3)
    svc.redis.start()
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("POST /sweeps with Redis down", sid, t_end, finished,
                   f"answered {code} in {took:.1f} s, published={body.get('published')}")


DRILLS: dict[str, Callable[[DrillService, int], Row]] = {
    "worker-main": drill_worker_main_kill,
    "pool-child": drill_pool_child_kill,
    "redis-kill": drill_redis_kill,
    "postgres-stop": drill_postgres_stop,
    "api-kill-rest": drill_api_kill_rest,
    "api-kill-webhook": drill_api_kill_webhook,
    "post-redis-down": drill_post_redis_down,
}
