"""The worker's container killed in the middle of a sweep: the sweep still finishes, with one
result per config, once the broker redelivers the killed worker's tasks."""
from __future__ import annotations

import base64
import json
import time

from smoke_deployment import Api, Deployment, one_result_per_config
from smoke_run import SmokeFailure, run


def effective_visibility_timeout(dep: Deployment) -> int:
    out = dep.exec("worker-cpu", "python", "-c",
                   "from settings import get_settings; print(get_settings().visibility_timeout_s)")
    return int(out.strip().splitlines()[-1])


def age_unacked(dep: Deployment, seconds: int) -> int:
    """Moves the broker's record of when each unacknowledged task was delivered `seconds` into
    the past (kombu's Redis transport: sorted set `unacked_index`, scored by delivery time), so
    that the running worker's own periodic restore (every 10 s, kombu's restore_visible) finds
    them past the visibility timeout and puts them back on their queue, as it would after that
    much time had gone by. Returns how many tasks were waiting to be restored."""
    out = dep.exec("redis", "redis-cli", "--raw", "ZRANGE", "unacked_index", "0", "-1", "WITHSCORES").split()
    pairs = list(zip(out[::2], out[1::2]))
    for tag, score in pairs:
        dep.exec("redis", "redis-cli", "ZADD", "unacked_index", f"{float(score) - seconds:.6f}", tag)
    return len(pairs)


def unacked_configs(dep: Deployment) -> list[str]:
    """The config hashes of the tasks waiting in the broker's unacknowledged set (kombu's Redis
    transport: hash `unacked`, each value [message, exchange, routing key]; the message body is
    Celery's [args, kwargs, embed], args = (sweep_id, [[config_hash, config], ...], ...))."""
    out = dep.exec("redis", "redis-cli", "--raw", "HVALS", "unacked")
    hashes: list[str] = []
    for line in out.splitlines():
        if not line.strip():
            continue
        message = json.loads(line)[0]
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body).decode()
        args = json.loads(body)[0]
        hashes += [item[0] for item in args[1]]
    return hashes


STALL_S = 10.0
# One kernel variant, so the API batches them ATTNSWEEP_TASK_BATCH_SIZE (8) to a task and the
# kill lands in batches that have stored part of their configs; data_seed makes 48 configs.
KILL_CONFIGS = [{"dtype": "f16", "g": 4, "seq_len_q": 1, "seq_len_k": 4096, "num_heads_q": 16, "num_heads_kv": 4,
                 "head_dim_qk": 128, "head_dim_v": 128, "with_attn_scale": True, "with_attn_bias": False,
                 "causal": True, "prefix_offset": None, "current_seq_len": None, "trans_q": False,
                 "trans_k": False, "trans_v": False, "trans_o": False, "return_lse": True, "split_kv": 8,
                 "rms_threshold": None, "data_seed": seed} for seed in range(1, 49)]


def wait_stalled(api: Api, sweep_id: int, since: int, timeout: float) -> dict:
    """The sweep once its count has moved past `since` (or a minute went by) and then stood
    still for STALL_S seconds, or once it is done."""
    deadline = time.monotonic() + timeout
    moved_by = time.monotonic() + 60
    last, last_change = None, time.monotonic()
    while True:
        s = api.sweep(sweep_id)
        if s["status"] == "done":
            return s
        if s["configs_done"] != last:
            last, last_change = s["configs_done"], time.monotonic()
        if (s["configs_done"] > since or time.monotonic() > moved_by) and time.monotonic() - last_change >= STALL_S:
            return s
        if time.monotonic() > deadline:
            raise SmokeFailure(f"sweep {sweep_id} still moving after {timeout:.0f} s")
        time.sleep(0.5)


def kill_worker_mid_sweep(dep: Deployment, api: Api, request: dict, timeout: float) -> list[str]:
    report: list[str] = []
    vt = effective_visibility_timeout(dep)
    accepted = api.submit(request)
    sid = accepted["id"]
    deadline = time.monotonic() + timeout
    while True:
        s = api.sweep(sid)
        if s["configs_done"] >= 1:
            break
        if time.monotonic() > deadline:
            raise SmokeFailure(f"sweep {sid}: no config done after {timeout:.0f} s")
        time.sleep(0.2)
    cid = dep.container("worker-cpu")
    run(["docker", "kill", cid], timeout=60)
    killed_at = api.sweep(sid)
    if killed_at["configs_done"] >= killed_at["configs_total"]:
        raise SmokeFailure(f"sweep {sid} finished before the worker was killed; make it larger")
    report.append(f"sweep {sid}: {killed_at['configs_total']} configs in {accepted.get('tasks', '?')} tasks; "
                  f"`docker kill` of the worker container at {killed_at['configs_done']} done")
    unacked = int(dep.exec("redis", "redis-cli", "ZCARD", "unacked_index").strip())
    report.append(f"tasks the killed worker held unacknowledged in Redis: {unacked}")
    time.sleep(5)
    st = dep.state("worker-cpu")
    report.append(f"5 s after the kill: worker container {st['Status']} (exit {st['ExitCode']}); its restart "
                  f"policy (unless-stopped) {'restarted it' if st['Running'] else 'did not restart it'}")
    if not st["Running"]:
        dep.compose("start", "worker-cpu", timeout=120)
        report.append("worker container started again: `compose start worker-cpu`")
    at_restart = api.sweep(sid)["configs_done"]
    # The restarted worker runs what is still queued; the killed worker's tasks are not on the
    # queue but in Redis's unacknowledged set, so the sweep stops short of its total until they
    # are redelivered.
    stalled = wait_stalled(api, sid, at_restart, timeout=180)
    held = int(dep.exec("redis", "redis-cli", "ZCARD", "unacked_index").strip())
    report.append(f"the restarted worker ran what was queued: {stalled['configs_done']}/{stalled['configs_total']} "
                  f"done, then nothing for {STALL_S:.0f} s (status {stalled['status']}); "
                  f"{held} tasks still unacknowledged in Redis")
    if stalled["status"] == "done":
        raise SmokeFailure(f"sweep {sid} finished without the killed worker's tasks: nothing was lost to redeliver")
    held_configs = unacked_configs(dep)
    stored = {r["config_hash"] for r in api.results(sid) if r["state"] == "done"}
    report.append(f"those tasks carry {len(held_configs)} configs, {len(set(held_configs) & stored)} of them "
                  f"stored before the kill (a redelivered batch skips them)")
    if vt > 120:
        # The settings' visibility timeout (an hour at least) is too long to wait for here.
        moved = age_unacked(dep, vt + 1)
        report.append(f"visibility timeout {vt} s: the {moved} unacknowledged tasks' delivery times moved "
                      f"{vt + 1} s back in Redis; the restarted worker's own periodic restore (kombu, every 10 s) "
                      f"then redelivers them")
    else:
        report.append(f"visibility timeout {vt} s (ATTNSWEEP_VISIBILITY_TIMEOUT_S): redelivery left to Redis")
    done = api.wait_done(sid, timeout=max(240.0, vt + 180.0) if vt <= 120 else 300.0)
    after = one_result_per_config(dep, api, done)
    report.append(f"sweep {sid} {done['status']} after the redelivery: {at_restart} configs were done when the "
                  f"worker came back, {stalled['configs_done'] - at_restart} from the queue, "
                  f"{done['configs_done'] - stalled['configs_done']} redelivered; outcomes {done['outcomes']}")
    report.append(f"one result per config: {after}")
    workers = {r["worker"] for r in api.results(sid)}
    report.append(f"results written by: {sorted(w for w in workers if w)}")
    return report
