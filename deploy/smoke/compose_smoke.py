#!/usr/bin/env python3
"""The deployment, built and run: `make compose-smoke`.

Builds a Debian base image (debootstrap, cached as a local image), the attnsweep image from the
Dockerfile on it, and PostgreSQL and Redis images from Debian's packages (the official images
cannot be pulled here); brings up docker-compose.yml with deploy/smoke/docker-compose.smoke.yml
(those two images swapped in, nothing else) under a project name of its own: PostgreSQL, Redis,
migrate, the API, a `cpu` worker and Flower, the API and Flower published on 127.0.0.1 only.
Then it submits a sweep through the API and waits for `done`; reads the dashboard, /metrics and
Flower's API; kills the worker's container in the middle of a second sweep and requires that
sweep to finish with exactly one result per config. `down -v` always runs at the end.

The GPU worker service cannot start without a GPU: it is never started here (docker-compose.yml
is validated as a file by tests/unit/deploy).

Only the standard library: it runs on the host's python3, outside the project's venv. Every
request goes to 127.0.0.1; pip inside the build reaches the package index through the CA bundle
given as the build secret `ca_bundle` (ATTNSWEEP_SMOKE_CA_BUNDLE, default the host's system
bundle when one exists).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy" / "smoke"
OVERRIDE = SMOKE / "docker-compose.smoke.yml"
BASE_IMAGE = os.environ.get("ATTNSWEEP_SMOKE_BASE_IMAGE", "attnsweep-smoke-base:bookworm")
APP_IMAGE = "attnsweep-smoke:latest"
POSTGRES_IMAGE = "attnsweep-smoke-postgres:latest"
REDIS_IMAGE = "attnsweep-smoke-redis:latest"
DEBIAN_MIRROR = os.environ.get("ATTNSWEEP_SMOKE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SERVICES = ["postgres", "redis", "migrate", "api", "worker-cpu", "flower"]
NODE = "smoke"
WORKER = f"cpu@{NODE}"
T0 = time.monotonic()


class SmokeFailure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[compose-smoke {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def run(cmd: list[str], *, timeout: float, capture: bool = False, check: bool = True,
        env: dict[str, str] | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    if not quiet:
        log("$ " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, text=True,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.STDOUT if capture else None)
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"timed out after {timeout:.0f} s: {' '.join(cmd)}") from None
    if check and proc.returncode != 0:
        tail = ("\n" + proc.stdout[-3000:]) if capture and proc.stdout else ""
        raise SmokeFailure(f"exit {proc.returncode}: {' '.join(cmd)}{tail}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_exists(name: str) -> bool:
    return run(["docker", "image", "inspect", name], timeout=60, capture=True, check=False, quiet=True).returncode == 0


def image_size_mb(name: str) -> float:
    out = run(["docker", "image", "inspect", "-f", "{{.Size}}", name], timeout=60, capture=True, quiet=True).stdout
    return int(out.strip()) / 1e6


# --- images ---------------------------------------------------------------------------------

def ensure_base() -> str:
    """The Debian bookworm minbase image the other three build on; made once, then reused."""
    if image_exists(BASE_IMAGE):
        log(f"base image {BASE_IMAGE}: cached ({image_size_mb(BASE_IMAGE):.0f} MB)")
        return "cached"
    if not shutil.which("debootstrap"):
        raise SmokeFailure("debootstrap is missing (apt-get install debootstrap)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnsweep-smoke-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR], timeout=900,
            capture=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, timeout=600,
                             capture_output=True, text=True)
        tar.stdout.close()
        if tar.wait(timeout=60) != 0 or imp.returncode != 0:
            raise SmokeFailure(f"docker import failed: {imp.stderr[-2000:]}")
    took = time.monotonic() - start
    log(f"base image {BASE_IMAGE}: debootstrap + import {took:.0f} s, {image_size_mb(BASE_IMAGE):.0f} MB")
    return f"{took:.0f} s"


def buildkit_docker() -> list[str]:
    """A docker client that builds with BuildKit (the Dockerfile mounts secrets): `docker` with
    buildx, else a client of Docker 20.10-22 with DOCKER_BUILDKIT=1 (Debian's /usr/bin/docker)."""
    probe = f"FROM {BASE_IMAGE}\nRUN --mount=type=secret,id=probe,required=false true\n"
    for client in ("docker", "/usr/bin/docker"):
        if not shutil.which(client):
            continue
        proc = subprocess.run([client, "build", "-q", "-"], input=probe, text=True, capture_output=True,
                              env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=120)
        if proc.returncode == 0:
            return [client]
    raise SmokeFailure("no docker client builds with BuildKit here (install docker-buildx, or Docker 20.10+)")


def build(client: list[str], tag: str, context: Path, dockerfile: Path, args: dict[str, str],
          secrets_: dict[str, str]) -> float:
    cmd = [*client, "build", "--progress=plain", "-t", tag, "-f", str(dockerfile)]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    for k, v in secrets_.items():
        cmd += ["--secret", f"id={k},src={v}"]
    start = time.monotonic()
    proc = run([*cmd, str(context)], timeout=1500, capture=True, check=False,
               env={**os.environ, "DOCKER_BUILDKIT": "1"})
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise SmokeFailure(f"building {tag} failed:\n{proc.stdout[-4000:]}")
    cached = sum(1 for line in proc.stdout.splitlines() if line.endswith(" CACHED"))
    log(f"built {tag}: {took:.1f} s ({cached} steps cached), {image_size_mb(tag):.0f} MB")
    return took


def airgapped_build(client: list[str]) -> list[str]:
    """The Dockerfile without any network: a base that already has Python, venv and git (so apt
    is not needed), the wheels in docker/wheelhouse built beforehand by that base's own pip,
    `docker build --network=none`; then a sweep in the image, still without a network. The
    wheels are removed afterwards."""
    report = []
    base_py = "attnsweep-smoke-base-py:bookworm"
    prep = (f"FROM {BASE_IMAGE}\nRUN apt-get update -q && apt-get install -y -q --no-install-recommends "
            "python3 python3-venv git ca-certificates && apt-get clean && rm -rf /var/lib/apt/lists/*\n")
    proc = subprocess.run([*client, "build", "-q", "-t", base_py, "-"], input=prep, text=True, capture_output=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=900)
    if proc.returncode != 0:
        raise SmokeFailure(f"building {base_py}: {proc.stderr[-2000:]}")
    wheelhouse = ROOT / "docker" / "wheelhouse"
    ca = os.environ.get("ATTNSWEEP_SMOKE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    ca_args = ["-v", f"{ca}:/run/ca.pem:ro", "-e", "PIP_CERT=/run/ca.pem"] if Path(ca).is_file() else []
    try:
        start = time.monotonic()
        # The base's own Python resolves the requirements: environment markers depend on its
        # exact version (redis needs async-timeout below Python 3.11.3, for one).
        run(["docker", "run", "--rm", "-v", f"{ROOT}:/src:ro", "-v", f"{wheelhouse}:/out", *ca_args, base_py,
             "sh", "-c", "python3 -m venv /tmp/v && mkdir /tmp/p && tar -C /src --exclude=./.venv --exclude=./.git "
             "--exclude=./docker/wheelhouse -c . | tar -C /tmp/p -x && "
             "/tmp/v/bin/pip wheel -q --disable-pip-version-check -w /out '/tmp/p[flower]' 'setuptools>=69'"],
            timeout=900, capture=True)
        for own in wheelhouse.glob("attnsweep-*.whl"):
            own.unlink()
        wheels = sorted(wheelhouse.glob("*.whl"))
        report.append(f"air-gapped: {len(wheels)} wheels "
                      f"({sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB) in docker/wheelhouse by the base's pip in "
                      f"{time.monotonic() - start:.0f} s")
        tag = "attnsweep-smoke-airgapped:latest"
        start = time.monotonic()
        proc = run([*client, "build", "--progress=plain", "--no-cache", "--network=none", "-t", tag,
                    "--build-arg", f"BASE_IMAGE={base_py}", str(ROOT)], timeout=1500, capture=True, check=False,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if proc.returncode != 0 or "no index" not in proc.stdout:
            raise SmokeFailure(f"air-gapped build failed:\n{proc.stdout[-4000:]}")
        report.append(f"air-gapped: `docker build --network=none --no-cache` from the wheelhouse {time.monotonic() - start:.0f} s, "
                      f"{image_size_mb(tag):.0f} MB")
        out = run(["docker", "run", "--rm", "--network", "none", tag, "sh", "-c",
                   "attnsweep run --samples 6 --seed 3 --backend cpu --db sqlite:////tmp/s.db --report-json /tmp/r.json"
                   " >/dev/null && python -c \"import json; r = json.load(open('/tmp/r.json')); "
                   "print(r.get('outcomes') or r)\""],
                  timeout=300, capture=True).stdout.strip().splitlines()[-1]
        report.append(f"air-gapped image, no network: `attnsweep run --samples 6 --backend cpu`: {out[:200]}")
        run(["docker", "rmi", tag], timeout=120, capture=True, quiet=True, check=False)
    finally:
        for w in wheelhouse.glob("*.whl"):
            w.unlink()
    return report


# --- compose --------------------------------------------------------------------------------

def compose_cli() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise SmokeFailure("neither `docker compose` nor docker-compose is installed")


class Deployment:
    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project = project
        self.env = env
        self.cli = compose_cli()

    def compose(self, *args: str, timeout: float = 300, capture: bool = False, check: bool = True,
                quiet: bool = False) -> subprocess.CompletedProcess:
        return run([*self.cli, "-p", self.project, "-f", "docker-compose.yml", "-f", str(OVERRIDE.relative_to(ROOT)),
                    *args], timeout=timeout, capture=capture, check=check, env=self.env, quiet=quiet)

    def container(self, service: str) -> str:
        out = self.compose("ps", "-q", service, capture=True, quiet=True).stdout.split()
        if not out:
            raise SmokeFailure(f"no container for {service}")
        return out[0]

    def state(self, service: str) -> dict:
        cid = self.container(service)
        out = run(["docker", "inspect", "-f", "{{json .State}}", cid], timeout=60, capture=True, quiet=True).stdout
        return json.loads(out)

    def exec(self, service: str, *cmd: str, timeout: float = 60) -> str:
        return run(["docker", "exec", self.container(service), *cmd], timeout=timeout, capture=True,
                   quiet=True).stdout

    def wait_healthy(self, services: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(services)
        while pending:
            for s in list(pending):
                st = self.state(s)
                health = (st.get("Health") or {}).get("Status")
                if health == "healthy":
                    pending.remove(s)
                elif not st.get("Running"):
                    raise SmokeFailure(f"{s} is not running: {st.get('Status')} (exit {st.get('ExitCode')})")
            if pending and time.monotonic() > deadline:
                raise SmokeFailure(f"not healthy after {timeout:.0f} s: {', '.join(pending)}")
            if pending:
                time.sleep(2)

    def status(self) -> str:
        rows = []
        for s in SERVICES:
            st = self.state(s)
            health = (st.get("Health") or {}).get("Status", "-")
            rows.append(f"{s} {st.get('Status')}" + (f" (exit {st.get('ExitCode')})" if not st.get("Running") else "")
                        + ("" if health == "-" else f" {health}"))
        line = "services: " + ", ".join(rows)
        log(line)
        return line


# --- HTTP on 127.0.0.1 ----------------------------------------------------------------------

def http(method: str, url: str, body: dict | None = None, headers: dict[str, str] | None = None,
         timeout: float = 15) -> tuple[int, bytes]:
    assert url.startswith("http://127.0.0.1:"), url
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        **({"content-type": "application/json"} if data else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str, headers: dict[str, str] | None = None) -> dict:
    code, body = http("GET", url, headers=headers)
    if code != 200:
        raise SmokeFailure(f"GET {url}: {code} {body[:500]!r}")
    return json.loads(body)


class Api:
    def __init__(self, port: int, token: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = {"Authorization": f"Bearer {token}"}

    def submit(self, request: dict) -> dict:
        code, body = http("POST", self.base + "/sweeps", request, self.auth, timeout=60)
        if code != 202:
            raise SmokeFailure(f"POST /sweeps: {code} {body[:1000]!r}")
        return json.loads(body)

    def sweep(self, sweep_id: int) -> dict:
        return get_json(f"{self.base}/sweeps/{sweep_id}")

    def wait_done(self, sweep_id: int, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            sweep = self.sweep(sweep_id)
            if sweep["status"] in ("done", "failed", "cancelled"):
                return sweep
            if time.monotonic() > deadline:
                raise SmokeFailure(f"sweep {sweep_id} not done after {timeout:.0f} s: "
                                   f"{sweep['status']}, {sweep['configs_done']}/{sweep['configs_total']}")
            time.sleep(1)

    def results(self, sweep_id: int) -> list[dict]:
        rows: list[dict] = []
        while True:
            page = get_json(f"{self.base}/sweeps/{sweep_id}/results?offset={len(rows)}&limit=500")
            rows += page["data"]
            if not page["has_more"] or not page["data"]:
                return rows


def one_result_per_config(dep: Deployment, api: Api, sweep: dict) -> str:
    """Every config of the sweep has exactly one stored result: the API's view and the table's."""
    sid, total = sweep["id"], sweep["configs_total"]
    rows = api.results(sid)
    done = [r for r in rows if r["state"] == "done" and r["outcome"]]
    hashes = {r["config_hash"] for r in rows}
    if not (sweep["status"] == "done" and sweep["configs_done"] == total == len(rows) == len(done) == len(hashes)):
        raise SmokeFailure(f"sweep {sid}: status {sweep['status']}, {sweep['configs_done']} done of {total}, "
                           f"{len(rows)} rows, {len(done)} with a result, {len(hashes)} distinct configs")
    if sum(sweep["outcomes"].values()) != total:
        raise SmokeFailure(f"sweep {sid}: outcomes {sweep['outcomes']} do not add up to {total}")
    sql = (f"SELECT count(*), count(DISTINCT config_hash), count(*) FILTER (WHERE state = 'done'), "
           f"min(attempts), max(attempts) FROM config_runs WHERE sweep_id = {int(sid)}")
    out = dep.exec("postgres", "psql", "-U", "attnsweep", "-d", "attnsweep", "-At", "-F", " ", "-c", sql).strip()
    n, distinct, n_done, min_att, max_att = map(int, out.split())
    if not (n == distinct == n_done == total and min_att == max_att == 1):
        raise SmokeFailure(f"sweep {sid} in PostgreSQL: {n} rows, {distinct} distinct, {n_done} done, "
                           f"attempts {min_att}..{max_att} (want {total} and 1..1)")
    return (f"{total} configs, {n} rows in config_runs ({distinct} distinct configs, every one done, "
            f"results written once each: attempts {min_att}..{max_att})")


# --- the worker kill ------------------------------------------------------------------------

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


# --- main -----------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-up", action="store_true", help="leave the deployment running (no down -v)")
    parser.add_argument("--airgapped", action="store_true",
                        help="also build the image from a wheelhouse with no network at all")
    args = parser.parse_args()

    def _terminate(signum, _frame):  # noqa: ANN001
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _terminate)

    run(["docker", "version", "--format", "client {{.Client.Version}}, engine {{.Server.Version}}"], timeout=60)
    base = ensure_base()
    client = buildkit_docker()
    ca = os.environ.get("ATTNSWEEP_SMOKE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    ca_secret = {"ca_bundle": ca} if ca and Path(ca).is_file() else {}
    log(f"building with {' '.join(client)} (BuildKit); pip's extra CA bundle: {ca if ca_secret else 'none'}")
    timings: dict[str, float | str] = {BASE_IMAGE: base}
    timings[APP_IMAGE] = build(client, APP_IMAGE, ROOT, ROOT / "Dockerfile",
                               {"BASE_IMAGE": BASE_IMAGE, "EXTRAS": "flower"}, ca_secret)
    timings[POSTGRES_IMAGE] = build(client, POSTGRES_IMAGE, SMOKE, SMOKE / "postgres.Dockerfile",
                                    {"BASE_IMAGE": BASE_IMAGE}, {})
    timings[REDIS_IMAGE] = build(client, REDIS_IMAGE, SMOKE, SMOKE / "redis.Dockerfile", {"BASE_IMAGE": BASE_IMAGE}, {})
    sizes = {name: image_size_mb(name) for name in (BASE_IMAGE, APP_IMAGE, POSTGRES_IMAGE, REDIS_IMAGE)}
    user = run(["docker", "image", "inspect", "-f", "{{.Config.User}} {{json .Config.Healthcheck.Test}}", APP_IMAGE],
               timeout=60, capture=True, quiet=True).stdout.strip()
    if not user or user.split()[0] in ("", "root", "0"):
        raise SmokeFailure(f"{APP_IMAGE} runs as root: {user!r}")
    log(f"{APP_IMAGE} runs as user {user.split()[0]}; image healthcheck {user.split(' ', 1)[1]}")
    # The build secret (CA bundle) and pip's combined bundle are gone from the image.
    leftovers = run(["docker", "run", "--rm", "--user", "0", "--entrypoint", "sh", APP_IMAGE, "-c",
                     "ls -A /tmp /run/secrets 2>/dev/null; find / -xdev -name ca.pem 2>/dev/null"],
                    timeout=120, capture=True, quiet=True).stdout.split()
    if [f for f in leftovers if not f.endswith(":")]:
        raise SmokeFailure(f"{APP_IMAGE} keeps build files: {leftovers}")

    airgapped = airgapped_build(client) if args.airgapped else []
    for line in airgapped:
        log(line)

    project = f"attnsweep-smoke-{os.getpid()}-{secrets.token_hex(3)}"
    api_port, flower_port = free_port(), free_port()
    token = secrets.token_urlsafe(32)
    flower_auth = f"smoke:{secrets.token_urlsafe(18)}"
    env = {**os.environ,
           "POSTGRES_PASSWORD": secrets.token_urlsafe(18), "ATTNSWEEP_API_TOKENS": f"smoke:admin:{token}",
           "ATTNSWEEP_WEBHOOK_SECRET": secrets.token_urlsafe(18), "FLOWER_BASIC_AUTH": flower_auth,
           "ATTNSWEEP_IMAGE": APP_IMAGE, "ATTNSWEEP_BIND_ADDRESS": "127.0.0.1",
           "ATTNSWEEP_API_PORT": str(api_port), "FLOWER_PORT": str(flower_port),
           "ATTNSWEEP_NODE": NODE, "ATTNSWEEP_CPU_WORKERS": "2",
           "ATTNSWEEP_SMOKE_POSTGRES_IMAGE": POSTGRES_IMAGE, "ATTNSWEEP_SMOKE_REDIS_IMAGE": REDIS_IMAGE}
    dep = Deployment(project, env)
    summary: list[str] = []
    ok = False
    try:
        up_start = time.monotonic()
        dep.compose("up", "-d", "--no-build", *SERVICES, timeout=600)
        dep.wait_healthy(["postgres", "redis", "api", "flower"], timeout=240)
        migrate = dep.state("migrate")
        if migrate["Running"] or migrate["ExitCode"] != 0:
            raise SmokeFailure(f"migrate: {migrate['Status']} exit {migrate['ExitCode']}")
        log(f"up: postgres, redis, api, flower healthy and migrate exited 0 after {time.monotonic() - up_start:.0f} s")
        ports = dep.compose("port", "api", "8000", capture=True, quiet=True).stdout.strip()
        fports = dep.compose("port", "flower", "5555", capture=True, quiet=True).stdout.strip()
        if not (ports.startswith("127.0.0.1:") and fports.startswith("127.0.0.1:")):
            raise SmokeFailure(f"published beyond loopback: api {ports}, flower {fports}")
        summary.append(f"published: api {ports}, flower {fports} (loopback only)")
        api = Api(api_port, token)
        health = get_json(api.base + "/healthz")
        log(f"/healthz: {json.dumps(health)}")

        # A sweep through the API, to the end.
        code, _ = http("POST", api.base + "/sweeps", {"samples": 1, "backend": "cpu"})
        if code != 401:
            raise SmokeFailure(f"POST /sweeps without a token: {code}, want 401")
        request = {"samples": 24, "seed": 11, "backend": "cpu", "label": "compose-smoke",
                   "ranges": {"seq_len_k": [1, 1024]}}
        start = time.monotonic()
        accepted = api.submit(request)
        sid = accepted["id"]
        sweep = api.wait_done(sid, timeout=300)
        took = time.monotonic() - start
        counts = one_result_per_config(dep, api, sweep)
        summary.append(f"sweep {sid} ({json.dumps(request)}): {sweep['status']} in {took:.1f} s; "
                       f"{counts}; outcomes {sweep['outcomes']}; filtered {sweep.get('filtered')}; "
                       f"draws {sweep.get('draws')}")

        code, page = http("GET", api.base + "/dashboard")
        code2, page2 = http("GET", f"{api.base}/dashboard/sweeps/{sid}")
        if code != 200 or code2 != 200 or b"<html" not in page.lower() or b"<html" not in page2.lower():
            raise SmokeFailure(f"/dashboard: {code} ({len(page)} bytes), /dashboard/sweeps/{sid}: {code2}")
        # The pages draw themselves from the API in the browser: every file they load must be served.
        assets = sorted(set(re.findall(r'(?:src|href)="(/dashboard/static/[^"]+)"', (page + page2).decode())))
        sizes_ = {a: http("GET", api.base + a) for a in assets}
        if not assets or any(c != 200 or not body for c, body in sizes_.values()):
            raise SmokeFailure(f"dashboard assets: {[(a, c, len(b)) for a, (c, b) in sizes_.items()]}")
        summary.append(f"/dashboard: 200 ({len(page)} bytes); /dashboard/sweeps/{sid}: 200 ({len(page2)} bytes); "
                       f"its {len(assets)} static files 200: "
                       + ", ".join(f"{a.rsplit('/', 1)[1]} {len(b) // 1024} KiB" for a, (_c, b) in sizes_.items()))
        code, metrics = http("GET", api.base + "/metrics")
        lines = [line for line in metrics.decode().splitlines() if line.startswith("attnsweep_")]
        if code != 200 or not lines:
            raise SmokeFailure(f"/metrics: {code}, {len(lines)} attnsweep_ samples")
        summary.append(f"/metrics: 200, {len(lines)} attnsweep_ samples, e.g. "
                       + "; ".join(line for line in lines if line.startswith(("attnsweep_sweeps{", "attnsweep_workers_alive"))))
        workers = get_json(api.base + "/workers")
        live = [(w["name"], w["queue"], w["backend"], w["alive"]) for w in workers["data"]]
        if (WORKER, "cpu", "cpu", True) not in live:
            raise SmokeFailure(f"/workers: {WORKER} not registered and alive: {live}")
        summary.append(f"/workers: {live}")

        fbase = f"http://127.0.0.1:{flower_port}"
        code, _ = http("GET", fbase + "/api/workers")
        basic = {"Authorization": "Basic " + base64.b64encode(flower_auth.encode()).decode()}
        fworkers = json.loads(http("GET", fbase + "/api/workers?refresh=1", headers=basic, timeout=30)[1] or b"{}")
        if code != 401 or WORKER not in fworkers:
            raise SmokeFailure(f"Flower /api/workers: {code} without auth (want 401); workers {list(fworkers)}")
        code, tasks = http("GET", fbase + "/api/tasks?limit=1000", headers=basic)
        ntasks = len(json.loads(tasks)) if code == 200 else None
        summary.append(f"Flower: /api/workers 401 without auth, with it {sorted(fworkers)}; /api/tasks {code}, "
                       f"{ntasks} tasks seen")

        dep.wait_healthy(["worker-cpu"], timeout=150)
        summary.append(dep.status())

        # The worker dies in the middle of a sweep; the sweep still finishes, once per config.
        kill_request = {"configs": KILL_CONFIGS, "backend": "cpu", "label": "compose-smoke-kill"}
        summary += kill_worker_mid_sweep(dep, api, kill_request, timeout=240)
        dep.status()
        ok = True
    except (Exception, KeyboardInterrupt) as exc:
        log(f"FAILED: {exc}")
        dep.compose("ps", check=False, timeout=60)
        dep.compose("logs", "--no-color", "--tail", "60", check=False, timeout=120)
    finally:
        if args.keep_up and ok:
            log(f"left up: project {project}; `{' '.join(dep.cli)} -p {project} down -v` removes it")
        else:
            dep.compose("down", "-v", "--remove-orphans", "-t", "10", check=False, timeout=300)
            label = f"label=com.docker.compose.project={project}"
            left = run(["docker", "ps", "-aq", "--filter", label], timeout=60, capture=True, quiet=True).stdout.split()
            vols = run(["docker", "volume", "ls", "-q", "--filter", label], timeout=60, capture=True,
                       quiet=True).stdout.split()
            summary.append(f"down -v: project {project}: {len(left)} containers and {len(vols)} volumes left")
            log(summary[-1])
            if left or vols:
                ok = False

    print("\n=== compose-smoke ===")
    for name, mb in sizes.items():
        t = timings.get(name)
        print(f"image {name:<34} {mb:7.0f} MB   build {t if isinstance(t, str) else f'{t:.1f} s'}")
    for line in airgapped + summary:
        print(line)
    print(f"total {time.monotonic() - T0:.0f} s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SmokeFailure as exc:
        log(f"FAILED: {exc}")
        sys.exit(1)
