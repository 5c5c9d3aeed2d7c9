"""The deployment under its own compose project, the API as a client sees it, and the check that
a sweep stored exactly one result per config."""
from __future__ import annotations

import json
import shutil
import subprocess
import time

from harness import http_json
from smoke_run import OVERRIDE, ROOT, SERVICES, SmokeFailure, log, run


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


def http(method: str, url: str, body: dict | None = None, headers: dict[str, str] | None = None,
         timeout: float = 15) -> tuple[int, bytes]:
    return http_json(method, url, body, headers, timeout, parse=False)


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
