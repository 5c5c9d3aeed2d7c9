"""One settings object, read from ATTNSWEEP_* environment variables when first asked for.

The only reader of ATTNSWEEP_* variables of the service, the CLI and the workers; it imports
nothing of the project, so every layer may import it. Values are read when get_settings() is
first called, never at import."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE = "sqlite:///attnsweep.db"
# What a triage run on a GPU may take past its time limit: the 5 s before its child process is
# killed (triage.child.GRACE_S) and a new process's start (imports, context, compile).
TRIAGE_RUN_OVERRUN_S = 15.0
# Values copied from an example file and never changed: refused wherever a secret is read.
PLACEHOLDER_SECRETS = frozenset({"changethis", "changeme", "change-me", "secret", "password", "token", "example", "xxx"})


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSWEEP_", extra="ignore")

    database_url: str = DEFAULT_SQLITE
    broker_url: str = "redis://127.0.0.1:6379/0"
    # Comma-separated bearer tokens for POST endpoints; empty means writes are open.
    api_tokens: str = ""
    config_time_limit_s: float = 120.0
    # Seconds between the plain progress lines `attnsweep run` writes when stderr is not a
    # terminal (cli/progress.py); a terminal gets a live bar instead.
    progress_interval_s: float = Field(default=10.0, ge=0)
    # compute-sanitizer for sanitized configs (workers/sanitize.py); unset: the PATH, then the
    # CUDA toolkit's bin folder.
    compute_sanitizer: str = ""

    # --- kernels (kernels/) -------------------------------------------------------------------
    # The compile cache's directory (kernels/cache.py), and whether it is off: disabled, every
    # prepare compiles and nothing is stored (bench/sweep.py's cold run measures compile times).
    kernel_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "attnsweep" / "kernels")
    kernel_cache_disable: bool = False
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
    def _no_placeholder_tokens(cls, v: str) -> str:
        bad = [t for t in (t.strip() for t in v.split(",")) if t.lower() in PLACEHOLDER_SECRETS]
        if bad:
            raise ValueError(f"api_tokens: {bad[0]!r} is a placeholder; set a real secret")
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
    def tokens(self) -> set[str]:
        return {t.strip() for t in self.api_tokens.split(",") if t.strip()}

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
