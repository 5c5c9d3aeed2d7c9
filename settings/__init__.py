"""One settings object, read from ATTNSWEEP_* environment variables when first asked for.

The only reader of ATTNSWEEP_* variables of the service, the CLI and the workers; it imports
nothing of the project, so every layer may import it. Values are read when get_settings() is
first called, never at import."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from settings.secrets import scrub_text

DEFAULT_SQLITE = "sqlite:///attnsweep.db"
# What a triage run on a GPU may take past its time limit: the 5 s before its child process is
# killed (isolation.child.GRACE_S) and a new process's start (imports, context, compile).
TRIAGE_RUN_OVERRUN_S = 15.0
# Values copied from an example file and never changed: refused wherever a secret is read.
PLACEHOLDER_SECRETS = frozenset({"changethis", "changeme", "change-me", "secret", "password", "token", "example", "xxx"})
# API token scopes, each including those after it: an admin token may submit and read.
SCOPES = ("admin", "submit", "read")
# A bearer token shorter than this is guessable by brute force over the network; refused at start.
MIN_TOKEN_CHARS = 32
_TOKEN_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


@dataclass(frozen=True)
class ApiToken:
    """One entry of ATTNSWEEP_API_TOKENS: `name:scope:secret`. The name is what the store records
    as a sweep's or bisection's submitter; the secret never leaves the settings."""

    name: str
    scope: str
    secret: str

    @property
    def scopes(self) -> frozenset[str]:
        return frozenset(SCOPES[SCOPES.index(self.scope):])


def parse_tokens(text: str) -> tuple[ApiToken, ...]:
    """ATTNSWEEP_API_TOKENS: comma-separated `name:scope:secret` entries (scope: admin, submit or
    read). ValueError naming the entry (by position and name, never its secret) and the rule."""
    tokens: list[ApiToken] = []
    for i, entry in enumerate(e.strip() for e in text.split(",")):
        if not entry:
            continue
        parts = entry.split(":", 2)
        if len(parts) != 3:
            raise ValueError(f"api_tokens: entry {i + 1} is not name:scope:secret (scope one of {', '.join(SCOPES)})")
        name, scope, secret = parts
        if not _TOKEN_NAME.match(name):
            raise ValueError(f"api_tokens: entry {i + 1}: the name must be 1 to 64 letters, digits or _ . @ -")
        if scope not in SCOPES:
            raise ValueError(f"api_tokens: token {name!r}: scope {scope!r} is not one of {', '.join(SCOPES)}")
        if secret.lower() in PLACEHOLDER_SECRETS:
            raise ValueError(f"api_tokens: token {name!r} is a placeholder; set a real secret")
        if len(secret) < MIN_TOKEN_CHARS:
            raise ValueError(f"api_tokens: token {name!r} has {len(secret)} characters; at least {MIN_TOKEN_CHARS} "
                             "are needed (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if any(t.name == name for t in tokens):
            raise ValueError(f"api_tokens: the name {name!r} is used twice; each token needs a name of its own")
        if any(t.secret == secret for t in tokens):
            raise ValueError(f"api_tokens: token {name!r} has the secret of another token")
        tokens.append(ApiToken(name, scope, secret))
    return tuple(tokens)


class Settings(BaseSettings):
    # hide_input_in_errors: a setting that does not validate is named with its rule, never
    # echoed (it may be a secret).
    model_config = SettingsConfigDict(env_prefix="ATTNSWEEP_", extra="ignore", hide_input_in_errors=True)

    database_url: str = DEFAULT_SQLITE
    broker_url: str = "redis://127.0.0.1:6379/0"
    # "on": every write needs a bearer token of api_tokens with its scope (and every read too when
    # read_auth is on). "off" opens every endpoint to whoever reaches the API, for a laptop; the
    # API logs it at start and the dashboard shows it.
    auth: Literal["on", "off"] = "on"
    # Comma-separated `name:scope:secret` bearer tokens (settings.parse_tokens); scope is admin,
    # submit or read.
    api_tokens: str = ""
    # Reads (results, workers, metrics, the dashboard's data) need a token of scope read too;
    # /healthz, the dashboard's page shells and the API's docs stay open.
    read_auth: bool = False
    config_time_limit_s: float = 120.0
    # Seconds between the plain progress lines `attnsweep run` writes when stderr is not a
    # terminal (cli/progress.py); a terminal gets a live bar instead.
    progress_interval_s: float = Field(default=10.0, ge=0)
    # compute-sanitizer for sanitized configs (isolation/sanitize.py); unset: the PATH, then the
    # CUDA toolkit's bin folder.
    compute_sanitizer: str = ""

    # --- kernels (kernels/) -------------------------------------------------------------------
    # The compile cache's directory (kernels/cache.py), and whether it is off: disabled, every
    # prepare compiles and nothing is stored (bench/sweep.py's cold run measures compile times).
    kernel_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "attnsweep" / "kernels")
    kernel_cache_disable: bool = False
    # The cache of inputs and host references (sweeps/datacache.py): its folder, shared by the
    # worker processes of a host, and the bytes it may hold. Off unless a folder is named: it
    # pays only for configs swept again (a CI host), and writing the entries costs a one-off
    # sweep part of its throughput (docs/performance.md).
    data_cache: Path | None = None
    data_cache_bytes: int = Field(default=16 << 30, ge=1 << 20)
    # The inputs' normal draws from a compiled loop (reference/normals.py, built into
    # kernel_cache/host with the host's C compiler): numpy's bits in less than half its time;
    # false draws them with numpy's Generator (so does a host without a C compiler).
    native_normals: bool = True
    # The CUDA backend's tensor-core (mma) path on devices that have it (sm_80+); false runs the
    # portable kernels only, as a GPU without tensor cores would.
    mma: bool = True
    # The folder holding cuda_fp16.h for NVRTC; empty: $CUDA_HOME, /usr/local/cuda, pip's copy.
    cuda_include: str = ""
    # The hostemu backend refuses configs past these (NotApplicable "hostemu_too_large"): time
    # goes mostly to the emulated barriers and shuffles, each one passed by every thread of the
    # block (OS threads on few cores); a grouped-path config of 6.7e7 multiply-adds (f16, 8 x 8
    # rows, 4,096 keys, D = 128) takes about 38 s on 2 cores, a rowwise one 7 s.
    hostemu_max_work: int = Field(default=5 * 10**7, ge=1)
    hostemu_max_blocks: int = Field(default=100_000, ge=1)

    # --- confinement of code that did not ship (isolation/, docs/security.md) -------------------
    # The unprivileged uid and gid a confined process runs as when the service runs as root (a
    # uid no other process uses; it needs no entry in /etc/passwd).
    sandbox_uid: int = Field(default=61000, ge=1, le=2**31 - 1)
    sandbox_gid: int = Field(default=61000, ge=1, le=2**31 - 1)
    # bubblewrap's path; empty: `bwrap` on the PATH.
    bwrap: str = ""
    # Limits of one confined process (rlimits): CPU seconds over its life, memory (its address
    # space; its data segment where a GPU driver reserves address space it never backs), the
    # largest file it may write, and the processes and threads the sandbox uid may run at once,
    # all confined processes of the host together (hostemu runs a thread per emulated GPU
    # thread: up to 1,024 a launch).
    sandbox_cpu_s: int = Field(default=3600, ge=1)
    sandbox_memory_bytes: int = Field(default=8 << 30, ge=256 << 20)
    sandbox_file_bytes: int = Field(default=1 << 30, ge=1 << 20)
    sandbox_processes: int = Field(default=4096, ge=8)
    # The size of its private /tmp (a tmpfs in memory).
    sandbox_tmp_bytes: int = Field(default=2 << 30, ge=16 << 20)
    # Wall-clock seconds the build command of a repository's attnsweep.toml may take (confined,
    # with the limits above); past it the build is killed and the commit counts as not built.
    build_time_limit_s: int = Field(default=1800, ge=1)

    # --- service (API and workers) ---------------------------------------------------------
    # Seconds a new PostgreSQL connection may take before the request is answered 503 or the
    # batch retried (store/db.py).
    db_connect_timeout_s: int = Field(default=3, ge=1, le=60)
    # Seconds a broker (Redis) connection may take to open, and one command to answer. Without
    # them a frozen Redis (accepting connections, answering nothing) hangs every publisher and
    # health check for as long as it stays frozen. Above kombu's 1 s blocking-pop timeout.
    broker_connect_timeout_s: float = Field(default=3.0, gt=0, le=60)
    broker_socket_timeout_s: float = Field(default=5.0, gt=1, le=120)
    # The lease on a delivered task (kombu's visibility_timeout): a task whose lease is not
    # renewed for this long goes back on its queue. A live worker's main process renews the
    # lease of every task it holds every visibility_timeout_s / 8, however long the task runs,
    # so only a dead (or cut-off) worker's tasks expire: they run again within about
    # visibility_timeout_s + 10 s. docs/service.md, "Delivery", says why this is safe.
    visibility_timeout_s: int = Field(default=120, ge=30, le=86400)
    # Prefix of the Celery queue names ("<prefix>cpu", "<prefix>gpu"): several deployments (or
    # test runs) can share one broker without taking each other's tasks.
    queue_prefix: str = ""
    # Configs per Celery task; a batch holds configs of one kernel variant where it can.
    task_batch_size: int = Field(default=8, ge=1, le=256)
    # After the soft per-config limit (SIGALRM) a watchdog gives the config this much longer,
    # then records `timeout` and ends the worker process (Celery starts a fresh one).
    config_time_grace_s: float = Field(default=30.0, ge=0)
    heartbeat_s: float = Field(default=15.0, gt=0)
    # A worker whose last heartbeat is older than this is not alive (its memory is not used).
    worker_stale_s: float = Field(default=60.0, gt=0)
    max_body_bytes: int = Field(default=16 << 20, ge=1024)
    max_sweep_configs: int = Field(default=100_000, ge=1)
    # The most draws one submitted sweep may cost the API (sweeps.spec.MAX_DRAWS is the hard
    # ceiling: about 50 s of one CPU); a request's max_draws above it is a 422, and the default
    # of 1000 * samples is cut to it.
    max_draws: int = Field(default=1_000_000, ge=1, le=1_000_000)
    # Triage of a finished sweep (workers/triage.py), bounded so a worker is not held long: the
    # largest TRIAGE_CLUSTERS clusters are shrunk and classified (the rest are clustered and
    # explained only), each shrink spends at most TRIAGE_SHRINK_RUNS runs and
    # TRIAGE_SHRINK_SECONDS, and one run may take TRIAGE_RUN_TIME_LIMIT_S before it is a timeout.
    triage_clusters: int = Field(default=8, ge=0, le=100)
    triage_shrink_runs: int = Field(default=100, ge=1)
    triage_shrink_seconds: float = Field(default=60.0, gt=0)
    triage_run_time_limit_s: float = Field(default=30.0, ge=0)
    # Bisections (POST /bisect, and a CI push's new failures: workers/bisect.py): Celery's hard
    # limit for one bisection task; passing it stores the bisection `error`.
    bisect_time_limit_s: float = Field(default=3600.0, gt=0)

    # --- CI integration (POST /webhooks/ci, GET /ci/...) -------------------------------------
    # Where CI sweeps read kernels/src at the pushed commit: a git URL or a local path.
    kernel_repo: str = ""
    # Every other repository whose source may be fetched and built (POST /bisect, a pull request
    # from a fork): comma-separated exact URLs or paths. kernel_repo is always trusted; anything
    # else is refused before a connection is made.
    kernel_repositories: str = ""
    # owner/name of the repository commit statuses are posted to; empty: kernel_repo's URL path
    # (https://host/owner/name.git), else the event's own validated full_name.
    status_repository: str = Field(default="", pattern=r"^$|^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    # Mirrors of a URL kernel_repo (a local path is read in place).
    kernel_repo_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "attnsweep" / "repos")
    # HMAC-SHA256 key of X-Hub-Signature-256; unset means the webhook refuses every delivery.
    webhook_secret: str = ""
    ci_samples: int = Field(default=500, ge=1)
    ci_backend: Literal["auto", "cpu", "cuda", "hip", "hostemu"] = "auto"
    # One fixed seed, so every commit is swept on the same configs and a pull request's
    # failures can be compared config by config with its base branch's.
    ci_seed: int = Field(default=1, ge=0)
    # Further sweep-request fields of every CI sweep (JSON: dtypes, ranges, max_tokens, ...).
    ci_spec: dict[str, Any] = Field(default_factory=dict)
    # A push whose sweep has new failures and that brought several commits is bisected for the
    # first bad commit of each bug: one bisection per triage cluster with new failures, for at
    # most this many clusters (the largest); 0: never.
    ci_bisect_clusters: int = Field(default=3, ge=0, le=20)
    # Commit statuses (ci/notify.py): with a token, the state of a CI sweep is posted to
    # STATUS_API/repos/OWNER/NAME/statuses/SHA (GitHub's statuses API) when it starts and ends.
    status_token: str = ""
    status_api: str = "https://api.github.com"
    status_context: str = "attnsweep"
    # The dashboard's address as CI users reach it (a status's target_url); unset: no link.
    public_url: str = ""

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if not v.startswith(("sqlite", "postgresql", "postgres")):
            raise ValueError(f"database_url={v!r}: must be a sqlite:/// or postgresql:// URL")
        return v

    @field_validator("api_tokens")
    @classmethod
    def _tokens_parse(cls, v: str) -> str:
        parse_tokens(v)
        return v

    @field_validator("webhook_secret")
    @classmethod
    def _no_placeholder_secret(cls, v: str) -> str:
        if v.strip().lower() in PLACEHOLDER_SECRETS:
            raise ValueError(f"webhook_secret: {v!r} is a placeholder; set a real secret")
        return v

    @field_validator("ci_spec")
    @classmethod
    def _ci_spec_leaves_own_settings(cls, v: dict[str, Any]) -> dict[str, Any]:
        # The rest of the request is validated where CI sweeps are built (submit/ci.py): this
        # package imports nothing of the project.
        own = sorted(set(v) & {"samples", "backend", "seed", "label"})
        if own:
            raise ValueError(f"ci_spec: {', '.join(own)} come from their own settings (ATTNSWEEP_CI_SAMPLES, "
                             "ATTNSWEEP_CI_BACKEND, ATTNSWEEP_CI_SEED) or from the event")
        return v

    @property
    def tokens(self) -> tuple[ApiToken, ...]:
        return parse_tokens(self.api_tokens)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret value these settings hold: what scrub() hides wherever it shows up."""
        from urllib.parse import urlsplit

        values = [t.secret for t in self.tokens] + [self.webhook_secret, self.status_token]
        for url in (self.database_url, self.broker_url, self.kernel_repo, *self.trusted_repositories):
            try:
                password = urlsplit(url).password
            except ValueError:
                password = None
            values.append(password or "")
        return tuple(v for v in values if v)

    @property
    def trusted_repositories(self) -> tuple[str, ...]:
        """kernel_repo and kernel_repositories, each as given (trailing slashes dropped)."""
        entries = [self.kernel_repo, *self.kernel_repositories.split(",")]
        return tuple(dict.fromkeys(e.strip().rstrip("/") for e in entries if e.strip()))

    def scrub(self, text: str) -> str:
        """`text` with user info taken out of every URL and every secret of these settings hidden."""
        return scrub_text(text, self.secrets)

    def queue_name(self, kind: str) -> str:
        """The broker queue of a kind of worker: "cpu" or "gpu"."""
        if kind not in ("cpu", "gpu"):
            raise ValueError(f"queue: {kind!r} is not cpu or gpu")
        return f"{self.queue_prefix}{kind}"

    @property
    def task_time_limit_s(self) -> float:
        """Celery's hard limit for one task of a full batch: the last resort behind the watchdog."""
        return self.task_batch_size * (self.config_time_limit_s + self.config_time_grace_s) + 60.0

    @property
    def triage_time_limit_s(self) -> float:
        """Celery's hard limit for a triage task: per shrunk cluster its shrink budget, the run
        that may overrun it, its classification (triage.classify: 3 repeats and 4 seeds, each
        within the run limit and TRIAGE_RUN_OVERRUN_S); and a minute for clustering and storing."""
        run = (self.triage_run_time_limit_s or 30.0) + TRIAGE_RUN_OVERRUN_S
        return self.triage_clusters * (self.triage_shrink_seconds + 8 * run) + 60.0

    @property
    def lease_renew_s(self) -> float:
        """How often a live worker renews the lease of each task it holds (workers.lease)."""
        return max(1.0, self.visibility_timeout_s / 8)


_in_use: list[Settings] = []


def use(settings: Settings) -> None:
    """Make `settings` what get_settings() answers in this process from now on, whatever the
    environment says: a confined process gets its settings from its parent, never from an
    inherited environment (isolation/)."""
    _in_use[:] = [settings]
    get_settings.cache_clear()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return _in_use[0] if _in_use else Settings()
