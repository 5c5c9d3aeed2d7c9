"""`make drills`: the service's dependencies die, as an operator would see it, and nothing is lost.

Starts everything it needs on free loopback ports, never the machine's own services: a
PostgreSQL cluster made with initdb in a temporary folder (the Debian binaries under
/usr/lib/postgresql/*/bin, run as the `postgres` user when started as root), a redis-server with
AOF on (as in docker-compose), the API (`attnsweep serve`) and two real Celery workers
(`python -m cli worker --queue cpu`). Then, one drill at a time, a sweep runs while something
dies, and one table row is printed per drill: configs stored, distinct, duplicated (written
more than once), lost (never stored), the sweep's final status and the recovery time (from the
end of the disruption to the sweep being done). Every wait is bounded; a drill that does not
finish in time is reported as such.

Drills (docs/service.md, Drills): worker main process SIGKILL x10 mid-sweep (restarted as a
supervisor would); pool child SIGKILL x10; Redis SIGKILL and restart; PostgreSQL stopped 20 s and
started; the API SIGKILLed between its commit and its publish (Redis frozen with SIGSTOP, then
resumed), through REST and through the CI webhook; POST /sweeps with Redis down.

`python -m drills [--only NAME,...] [--configs N] [--keep]`.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SECRET = "drill-webhook-secret-5b1f0c"
# The drills' own API token (the API refuses writes without one).
API_SECRET = "drills-" + hashlib.sha256(b"attnsweep drills").hexdigest()[:32]
LEASE_S = 30           # ATTNSWEEP_VISIBILITY_TIMEOUT_S for the drills (the minimum)
DONE_TIMEOUT_S = 300   # the longest any drill waits for its sweep
# Small configs: a few tenths of a second of numpy each on one core.
BASE = dict(dtype="f16", g=1, seq_len_q=32, seq_len_k=2048, num_heads_q=4, num_heads_kv=2, head_dim_qk=64, head_dim_v=64)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.3) -> Any:
    end = time.monotonic() + timeout
    while True:
        try:
            value = pred()
        except Exception:  # noqa: BLE001 - a dependency is down: keep waiting
            value = None
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


# --- the dependencies -------------------------------------------------------------------------
class Postgres:
    def __init__(self, base: Path):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not bins:
            raise SystemExit("drills: no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        self.bin = Path(bins[-1]).parent
        self.dir = base / "pg"
        self.data = self.dir / "data"
        self.port = free_port()
        self.dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(base, 0o755)
        subprocess.run(as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                                    "--no-sync"]), check=True, capture_output=True)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/attnsweep"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l",
                                    str(self.dir / "log"), "-w", "-t", "60", "start"]), check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run(as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60",
                                    "stop"]), capture_output=True)

    def createdb(self) -> None:
        subprocess.run(as_postgres([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                                    "attnsweep"]), check=True, capture_output=True)


class Redis:
    def __init__(self, base: Path):
        self.dir = base / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      str(self.dir), "--appendonly", "yes", "--save", ""],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        wait_for(lambda: redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1).ping(), 30, "redis")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    logfile: Path
    proc: subprocess.Popen | None = None
    log_from: int = 0

    def start(self) -> None:
        self.log_from = self.logfile.stat().st_size if self.logfile.exists() else 0
        out = self.logfile.open("a")
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        out.close()

    def children(self) -> list[int]:
        pids = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                pids.append(int(Path(stat).parent.name))
        return pids

    def kill_main(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


# --- the service ------------------------------------------------------------------------------
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


@dataclass
class Service:
    base: Path
    pg: Postgres
    redis: Redis
    api_port: int = field(default_factory=free_port)
    api: Proc | None = None
    workers: list[Proc] = field(default_factory=list)
    kernel_repo: Path | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSWEEP_")}
        env.update(
            ATTNSWEEP_DATABASE_URL=self.pg.url, ATTNSWEEP_BROKER_URL=self.redis.url, ATTNSWEEP_QUEUE_PREFIX="drill-",
            ATTNSWEEP_HEARTBEAT_S="2", ATTNSWEEP_VISIBILITY_TIMEOUT_S=str(LEASE_S), ATTNSWEEP_TASK_BATCH_SIZE="4",
            ATTNSWEEP_WEBHOOK_SECRET=SECRET, ATTNSWEEP_KERNEL_REPO=str(self.kernel_repo or ""),
            ATTNSWEEP_API_TOKENS=f"drills:admin:{API_SECRET}",
            ATTNSWEEP_CI_SAMPLES="40", ATTNSWEEP_CI_BACKEND="cpu",
            ATTNSWEEP_CI_SPEC=json.dumps({"ranges": {"seq_len_k": [1, 1024], "seq_len_q": [1, 16], "g": [1, 2]}}),
            ATTNSWEEP_KERNEL_CACHE=str(self.base / "kernel-cache"), ATTNSWEEP_KERNEL_REPO_CACHE=str(self.base / "repos"),
            OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT),
        )
        return env

    # processes
    def start_api(self) -> None:
        self.api = Proc("api", [PY, "-m", "cli", "serve", "--port", str(self.api_port)], self.env(), self.base / "api.log")
        self.api.start()
        wait_for(lambda: self.get("/healthz")[0] in (200, 503), 60, "the API to answer")

    def start_worker(self, i: int) -> Proc:
        name = f"drill{i}@{socket.gethostname()}"
        w = Proc(name, [PY, "-m", "cli", "worker", "--queue", "cpu", "--name", name], self.env(),
                 self.base / f"worker{i}.log")
        w.start()
        if i < len(self.workers):
            self.workers[i] = w
        else:
            self.workers.append(w)
        return w

    def wait_workers_ready(self, timeout: float = 90) -> None:
        def ready() -> bool:
            for w in self.workers:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"{w.name} exited: see {w.logfile}")
            return all("ready." in w.logfile.read_text(errors="replace")[w.log_from:] for w in self.workers)

        wait_for(ready, timeout, "the workers to be ready")

    # HTTP
    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                timeout: float = 30) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", data=body, method=method,
                                     headers={"content-type": "application/json",
                                              "authorization": f"Bearer {API_SECRET}", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, raw

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path, timeout=10)

    def post_sweep(self, n: int, seed: int, timeout: float = 30) -> tuple[int, Any]:
        configs = [{**BASE, "data_seed": seed * 100000 + i} for i in range(n)]
        return self.request("POST", "/sweeps", json.dumps({"configs": configs, "backend": "cpu", "label": f"drill {seed}"}).encode(),
                            timeout=timeout)

    def deliver(self, payload: dict[str, Any], delivery: str) -> tuple[int, Any]:
        body = json.dumps(payload).encode()
        sig = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        return self.request("POST", "/webhooks/ci", body, {"X-GitHub-Event": "push", "X-GitHub-Delivery": delivery,
                                                          "X-Hub-Signature-256": sig}, timeout=60)

    # the store, read directly (the API may be the thing that is down)
    def db(self, sql: str, *args: Any) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.pg.url, connect_timeout=3) as conn:
            return conn.execute(sql, args).fetchall()

    def sweep_status(self, sid: int) -> str | None:
        rows = self.db("SELECT status FROM sweeps WHERE id = %s", sid)
        return rows[0][0] if rows else None

    def wait_done(self, sid: int, timeout: float = DONE_TIMEOUT_S) -> bool:
        try:
            wait_for(lambda: self.sweep_status(sid) in ("done", "failed", "cancelled"), timeout, f"sweep {sid}", interval=0.5)
            return True
        except TimeoutError:
            return False

    def row(self, drill: str, sid: int, t_end: float | None, finished: bool, note: str = "") -> Row:
        total = self.db("SELECT configs_total FROM sweeps WHERE id = %s", sid)[0][0]
        stored, distinct, duplicated = self.db(
            "SELECT count(*), count(DISTINCT config_hash), count(*) FILTER (WHERE attempts > 1) "
            "FROM config_runs WHERE sweep_id = %s AND state = 'done'", sid)[0]
        recovery = (time.monotonic() - t_end) if (finished and t_end is not None) else None
        return Row(drill, total, stored, distinct, duplicated, total - distinct, self.sweep_status(sid) or "?",
                   recovery, note)

    def wait_progress(self, sid: int, done: int, timeout: float = 120) -> None:
        wait_for(lambda: self.db("SELECT count(*) FROM config_runs WHERE sweep_id = %s AND state = 'done'", sid)[0][0] >= done,
                 timeout, f"{done} configs of sweep {sid} stored", interval=0.3)


# --- the drills ---------------------------------------------------------------------------------
def drill_worker_main_kill(svc: Service, n: int) -> Row:
    # A sweep long enough that all ten kills land while it runs.
    status, body = svc.post_sweep(3 * n, 1)
    sid = body["id"]
    svc.wait_progress(sid, 2)
    kills = 0
    for k in range(10):
        i = k % 2
        w = svc.workers[i]
        if svc.sweep_status(sid) == "done":
            break
        w.kill_main()  # the main process only: its pool child is orphaned, as after an OOM kill
        kills += 1
        svc.start_worker(i)  # restarted as a supervisor (compose's restart policy) would
        time.sleep(3)
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("worker main SIGKILL x10", sid, t_end, finished, f"{kills} kills; lease {LEASE_S} s")


def drill_pool_child_kill(svc: Service, n: int) -> Row:
    status, body = svc.post_sweep(3 * n, 2)
    sid = body["id"]
    svc.wait_progress(sid, 2)
    kills = 0
    for k in range(40):  # ten kills; a worker between two children has none to kill for a moment
        if kills == 10 or svc.sweep_status(sid) == "done":
            break
        w = svc.workers[k % 2]
        children = w.children()
        if children:
            try:
                os.kill(children[0], signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        time.sleep(1.0)
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("pool child SIGKILL x10", sid, t_end, finished, f"{kills} kills")


def drill_redis_kill(svc: Service, n: int) -> Row:
    status, body = svc.post_sweep(n, 3)
    sid = body["id"]
    svc.wait_progress(sid, 4)
    svc.redis.kill()
    time.sleep(3)
    svc.redis.start()
    t_end = time.monotonic()
    finished = svc.wait_done(sid)
    return svc.row("Redis SIGKILL, restart", sid, t_end, finished, "down 3 s, AOF on")


def drill_postgres_stop(svc: Service, n: int) -> Row:
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


def _kill_api_after_commit(svc: Service, start: Callable[[], Any], sweeps_before: int) -> int:
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


def drill_api_kill_rest(svc: Service, n: int) -> Row:
    before = svc.db("SELECT coalesce(max(id), 0) FROM sweeps")[0][0]
    sid = _kill_api_after_commit(svc, lambda: svc.post_sweep(n, 5, timeout=60), before)
    unpublished = svc.db("SELECT count(*) FROM config_runs WHERE sweep_id = %s AND enqueued_at IS NULL", sid)[0][0]
    svc.redis.thaw()
    t_end = time.monotonic()
    svc.start_api()
    finished = svc.wait_done(sid)
    return svc.row("API SIGKILL after commit (REST)", sid, t_end, finished, f"{unpublished} unpublished at the kill")


def drill_api_kill_webhook(svc: Service, n: int) -> Row:
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


def drill_post_redis_down(svc: Service, n: int) -> Row:
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


DRILLS: dict[str, Callable[[Service, int], Row]] = {
    "worker-main": drill_worker_main_kill,
    "pool-child": drill_pool_child_kill,
    "redis-kill": drill_redis_kill,
    "postgres-stop": drill_postgres_stop,
    "api-kill-rest": drill_api_kill_rest,
    "api-kill-webhook": drill_api_kill_webhook,
    "post-redis-down": drill_post_redis_down,
}


def print_table(rows: list[Row]) -> None:
    head = f"| {'drill':<36} | configs | stored | distinct | duplicated | lost | status | recovery | note"
    print(head)
    print("|" + "-" * 38 + "|---------|--------|----------|------------|------|--------|----------|-----")
    for r in rows:
        rec = f"{r.recovery_s:.0f} s" if r.recovery_s is not None else "-"
        print(f"| {r.drill:<36} | {r.total:>7} | {r.stored:>6} | {r.distinct:>8} | {r.duplicated:>10} | {r.lost:>4} | "
              f"{r.status:<6} | {rec:>8} | {r.note}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help=f"comma-separated drills of: {', '.join(DRILLS)}")
    parser.add_argument("--configs", type=int, default=150, help="configs per sweep")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, data)")
    args = parser.parse_args()
    chosen = [d.strip() for d in args.only.split(",") if d.strip()] or list(DRILLS)
    unknown = [d for d in chosen if d not in DRILLS]
    if unknown:
        parser.error(f"--only: unknown drill {unknown[0]!r}; one of {', '.join(DRILLS)}")
    base = Path(tempfile.mkdtemp(prefix="attnsweep-drills-"))
    log(f"working in {base}")
    pg, redis_ = Postgres(base), Redis(base)
    svc = Service(base, pg, redis_)
    rows: list[Row] = []
    try:
        pg.start()
        pg.createdb()
        redis_.start()
        subprocess.run([PY, "-m", "cli", "db", "upgrade"], cwd=ROOT, env=svc.env(), check=True, capture_output=True)
        svc.start_api()
        svc.start_worker(0)
        svc.start_worker(1)
        svc.wait_workers_ready()
        log(f"PostgreSQL :{pg.port}, Redis :{redis_.port}, API :{svc.api_port}, workers {[w.name for w in svc.workers]}")
        for name in chosen:
            log(f"drill {name}")
            t0 = time.monotonic()
            try:
                row = DRILLS[name](svc, args.configs)
            except Exception as exc:  # noqa: BLE001 - a drill that breaks is a row that says so
                row = Row(name, status="error", note=f"{type(exc).__name__}: {exc}")
            log(f"drill {name}: {row} ({time.monotonic() - t0:.0f} s)")
            rows.append(row)
            # Every worker alive again before the next drill.
            for i, w in enumerate(svc.workers):
                if w.proc.poll() is not None:
                    svc.start_worker(i)
            if svc.api.proc.poll() is not None:
                svc.start_api()
            svc.wait_workers_ready()
        stuck = svc.db("SELECT count(*) FROM sweeps WHERE status IN ('queued', 'running')")[0][0]
    finally:
        for w in svc.workers:
            w.stop()
        if svc.api is not None:
            svc.api.stop()
        redis_.kill()
        pg.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print_table(rows)
    print(f"sweeps left queued or running: {stuck}")
    bad = [r for r in rows if r.lost or r.duplicated or r.status != "done"]
    return 1 if bad or stuck else 0


if __name__ == "__main__":
    sys.exit(main())
