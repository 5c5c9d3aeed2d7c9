"""The security drills' deployment: its own PostgreSQL and Redis, the API and one cpu worker
(harness/), the deployment's kernel repository (a git repository of kernels/src), a stand-in for
the code host's statuses API, and the secrets whose values no answer, log or stored row may show."""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness import PostgresCluster, RedisServer, ServiceStack, service_env, wait_for

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "acme/kernels"       # the deployment's repository (ATTNSWEEP_STATUS_REPOSITORY)
CONFIG_LIMIT_S = 15               # per-config time limit: a kernel that sleeps forever is cut here
CI_SAMPLES = 3                    # configs of each CI sweep of an attack commit
PROCESSES = 512                   # ATTNSWEEP_SANDBOX_PROCESSES: what a fork bomb is held at
# One variant, small: every config of a CI sweep compiles once on hostemu.
CI_SPEC = {"dtypes": ["f16"], "ranges": {"seq_len_k": [1, 64], "seq_len_q": [1, 2], "g": [1, 1],
                                         "num_heads_q": [1, 2], "num_heads_kv": [1, 1], "head_dim_qk": [16, 16],
                                         "head_dim_v": [16, 16]}}


@dataclass
class Secrets:
    """Every secret the deployment holds: no answer, log line or stored row may show one."""

    admin: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    submit: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    webhook: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    status: str = field(default_factory=lambda: "status-" + secrets.token_urlsafe(24))
    database: str = field(default_factory=lambda: "dbpw-" + secrets.token_hex(12))

    def values(self) -> dict[str, str]:
        return {"admin token": self.admin, "submit token": self.submit, "webhook secret": self.webhook,
                "status token": self.status, "database password": self.database}

    def found_in(self, text: str) -> list[str]:
        return [name for name, value in self.values().items() if value in text]


class Forge:
    """The code host's statuses API: records every request it is sent."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        forge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                forge.requests.append({"path": self.path, "body": json.loads(body or b"{}")})
                self.send_response(201)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class KernelRepo:
    """A git repository of kernels/src (this checkout's), committed to by the drills."""

    def __init__(self, path: Path):
        self.path = path
        shutil.copytree(ROOT / "kernels" / "src", path / "kernels" / "src",
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.git("init", "--quiet", "--initial-branch=main")
        self.commit("the kernels as shipped")

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=drill", "-c", "user.email=drill@example.invalid", *args],
                              cwd=self.path, check=True, capture_output=True, text=True).stdout.strip()

    def commit(self, message: str, extra: str = "") -> str:
        entry = self.path / "kernels" / "src" / "attention.hip"
        shipped = (ROOT / "kernels" / "src" / "attention.hip").read_text()
        entry.write_text(shipped + extra)
        self.git("add", "-A")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")


@dataclass
class SecurityStack:
    base: Path
    keys: Secrets = field(default_factory=Secrets)
    forge: Forge = field(default_factory=Forge)

    def __post_init__(self) -> None:
        self.pg = PostgresCluster(self.base / "pg")
        self.redis = RedisServer(self.base / "redis")
        self.repo = KernelRepo(self.base / "kernel-repo")
        self.stack: ServiceStack | None = None
        self.answers: list[str] = []   # every answer the API gave, searched for secrets at the end

    def env(self, **extra: str) -> dict[str, str]:
        # The password is in the URL only: PostgreSQL trusts loopback here, so it is a secret the
        # processes hold and nothing checks, which is what the drills need.
        url = self.pg.url.replace("postgres@", f"postgres:{self.keys.database}@")
        settings = dict(
            ATTNSWEEP_API_TOKENS=f"ops:admin:{self.keys.admin},ci:submit:{self.keys.submit}",
            ATTNSWEEP_WEBHOOK_SECRET=self.keys.webhook, ATTNSWEEP_STATUS_TOKEN=self.keys.status,
            ATTNSWEEP_STATUS_API=self.forge.url, ATTNSWEEP_STATUS_REPOSITORY=REPOSITORY,
            ATTNSWEEP_KERNEL_REPO=str(self.repo.path), ATTNSWEEP_KERNEL_REPO_CACHE=str(self.base / "repos"),
            ATTNSWEEP_KERNEL_CACHE=str(self.base / "kernel-cache"), ATTNSWEEP_CI_BACKEND="hostemu",
            ATTNSWEEP_CI_SAMPLES=str(CI_SAMPLES), ATTNSWEEP_CI_SPEC=json.dumps(CI_SPEC), ATTNSWEEP_CI_BISECT_CLUSTERS="0",
            ATTNSWEEP_TRIAGE_CLUSTERS="0", ATTNSWEEP_CONFIG_TIME_LIMIT_S=str(CONFIG_LIMIT_S),
            ATTNSWEEP_CONFIG_TIME_GRACE_S="5", ATTNSWEEP_HEARTBEAT_S="2", ATTNSWEEP_SANDBOX_PROCESSES=str(PROCESSES))
        return service_env(url, self.redis.url, "sec-", **{**settings, **extra})

    def start(self) -> None:
        self.pg.start()
        self.pg.createdb()
        self.redis.start()
        from store.migrate import upgrade

        upgrade(self.pg.url)
        self.stack = ServiceStack(self.env(), self.base)
        self.stack.start_api()
        self.stack.start_worker("sec0", concurrency=1)

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        self.redis.kill()
        self.pg.stop()
        self.forge.server.shutdown()

    # -- HTTP ---------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, token: str | None = "admin",
                headers: dict[str, str] | None = None, raw_body: bytes | None = None) -> tuple[int, Any]:
        auth = {"authorization": f"Bearer {getattr(self.keys, token)}"} if token else {}
        code, answer = self.stack.request(method, path, body, {**auth, **(headers or {})}, raw_body=raw_body)
        self.answers.append(answer.decode(errors="replace") if isinstance(answer, bytes) else json.dumps(answer))
        return code, answer

    def deliver(self, event: str, payload: dict[str, Any], delivery: str) -> tuple[int, Any]:
        body = json.dumps(payload).encode()
        sig = "sha256=" + hmac.new(self.keys.webhook.encode(), body, hashlib.sha256).hexdigest()
        return self.request("POST", "/webhooks/ci", token=None, raw_body=body, headers={
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": sig,
            "content-type": "application/json"})

    def push(self, sha: str, delivery: str) -> tuple[int, Any]:
        return self.deliver("push", {"ref": "refs/heads/main", "before": "0" * 40, "after": sha,
                                     "repository": {"full_name": REPOSITORY}}, delivery)

    # -- the store ------------------------------------------------------------------------------------
    def db(self, sql: str, *args: Any) -> list[tuple]:
        return self.pg.sql(sql, *args)

    def wait_done(self, sweep_id: int, timeout: float = 600) -> str:
        def ended() -> str | None:
            rows = self.db("SELECT status FROM sweeps WHERE id = %s", sweep_id)
            return rows[0][0] if rows and rows[0][0] in ("done", "failed", "cancelled") else None

        return wait_for(ended, timeout, f"sweep {sweep_id}", interval=0.5, ignore=(Exception,))

    def outcomes(self, sweep_id: int) -> list[tuple[str, str, int, str]]:
        """(config hash, outcome, attempts, detail) of every config of the sweep."""
        return self.db("SELECT config_hash, coalesce(outcome, state), attempts, coalesce(detail, '') "
                       "FROM config_runs WHERE sweep_id = %s ORDER BY seq", sweep_id)

    def stored_text(self) -> str:
        """Every text column a client can read back: results' details, sweeps' and bisections' errors."""
        rows = self.db("SELECT coalesce(detail, '') || coalesce(reproducer, '') FROM config_runs "
                       "UNION ALL SELECT coalesce(error, '') || coalesce(request::text, '') FROM sweeps "
                       "UNION ALL SELECT coalesce(error, '') || repo FROM bisections")
        return "\n".join(r[0] for r in rows)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.base.glob("*.log"))
