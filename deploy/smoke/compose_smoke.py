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
bundle when one exists). The parts: smoke_run.py, smoke_images.py, smoke_deployment.py,
smoke_worker_kill.py beside this file; free ports and HTTP from harness/.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import signal
import sys
import time
from pathlib import Path

from smoke_run import (APP_IMAGE, BASE_IMAGE, NODE, POSTGRES_IMAGE, REDIS_IMAGE, ROOT, SERVICES, SMOKE, T0, WORKER,
                       SmokeFailure, image_size_mb, log, run)
from harness import free_port
from smoke_deployment import Api, Deployment, get_json, http, one_result_per_config
from smoke_images import airgapped_build, build, buildkit_docker, ensure_base
from smoke_worker_kill import KILL_CONFIGS, kill_worker_mid_sweep


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
