"""SQLAlchemy 2 models. The schema is created only by the Alembic migrations in migrations/."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from attnconfig.outcomes import FAILING_OUTCOMES

# The SQL condition "this result is a failure", shared by the partial index and the queries.
FAILING_SQL = "outcome IN (" + ", ".join(f"'{o}'" for o in FAILING_OUTCOMES) + ")"


class Base(DeclarativeBase):
    pass


class Sweep(Base):
    __tablename__ = "sweeps"
    # The base-branch lookup of a pull request's verdict: newest finished sweep of (repository, ref).
    __table_args__ = (Index("ix_sweeps_repository_ref", "repository", "ref", "status"),
                      UniqueConstraint("idempotency_key", name="uq_sweeps_idempotency_key"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    label: Mapped[str | None] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    backend: Mapped[str] = mapped_column(String(16))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    samples: Mapped[int] = mapped_column(Integer)
    draws: Mapped[int] = mapped_column(BigInteger, default=0)
    configs_total: Mapped[int] = mapped_column(Integer, default=0)
    splitkv_budget: Mapped[int] = mapped_column(BigInteger)
    budget_source: Mapped[str] = mapped_column(String(16))
    device: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Service mode (revision 0002): the broker queue its configs went to, the sweep it re-runs.
    queue: Mapped[str | None] = mapped_column(String(64))
    rerun_of: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), index=True)
    # CI (revision 0003): what a push or pull request asked to test. source_hash names the
    # bundle of kernels/src the workers compile; null means the workers' own kernels/src.
    repository: Mapped[str | None] = mapped_column(String(200))
    ref: Mapped[str | None] = mapped_column(String(255))
    commit_sha: Mapped[str | None] = mapped_column(String(64), index=True)
    event: Mapped[str | None] = mapped_column(String(16))  # "push", "pull_request"; null: not from CI
    base_ref: Mapped[str | None] = mapped_column(String(255))  # a pull request's target branch
    pr_number: Mapped[int | None] = mapped_column(Integer)
    source_hash: Mapped[str | None] = mapped_column(ForeignKey("source_bundles.hash", ondelete="RESTRICT"), index=True)
    # Revision 0005: the client's Idempotency-Key of POST /sweeps (a retried
    # request with the same key gets this sweep back) and the sha256 of the request it came with.
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_sha256: Mapped[str | None] = mapped_column(String(64))
    # Revision 0009: the name of the API token that submitted it ("webhook": a CI delivery; "cli":
    # `attnsweep run`); null where authentication was off.
    submitted_by: Mapped[str | None] = mapped_column(String(64))
    # Revision 0010: the kernel under test (kernels/plugins) as asked for (`--kernel`: "attnsweep",
    # a plug-in's name, module:attr, a path), and the name and version it ran as (null until a
    # result says).
    kernel: Mapped[str] = mapped_column(String(1000), default="attnsweep", server_default="attnsweep")
    kernel_name: Mapped[str | None] = mapped_column(String(200))
    kernel_version: Mapped[str | None] = mapped_column(String(64))

    filter_counts: Mapped[list["FilterCount"]] = relationship(back_populates="sweep", cascade="all, delete-orphan")


class FilterCount(Base):
    __tablename__ = "filter_counts"

    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)

    sweep: Mapped[Sweep] = relationship(back_populates="filter_counts")


class ConfigRun(Base):
    """One config of one sweep: queued on submission, its result written over it once run."""

    __tablename__ = "config_runs"
    __table_args__ = (
        UniqueConstraint("sweep_id", "config_hash", name="uq_config_runs_sweep_config"),
        Index("ix_config_runs_sweep_outcome", "sweep_id", "outcome"),
        Index("ix_config_runs_outcome_finished", "outcome", "finished_at"),
        Index("ix_config_runs_dtype_split", "dtype", "split_kv"),
        # Revision 0002: "is anything of this sweep still queued?" after every result, and the
        # newest failures first (GET /failures) without sorting every failure ever stored.
        Index("ix_config_runs_sweep_state", "sweep_id", "state"),
        Index(
            "ix_config_runs_failures_recent", "finished_at", "id",
            postgresql_where=text(FAILING_SQL), sqlite_where=text(FAILING_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)  # position in the sampled order
    config_hash: Mapped[str] = mapped_column(String(64), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)

    # docs/spec.md §1 fields as columns, so failure queries filter in SQL.
    dtype: Mapped[str] = mapped_column(String(8), index=True)
    g: Mapped[int] = mapped_column(Integer)
    seq_len_q: Mapped[int] = mapped_column(Integer, index=True)
    seq_len_k: Mapped[int] = mapped_column(Integer, index=True)
    num_heads_q: Mapped[int] = mapped_column(Integer)
    num_heads_kv: Mapped[int] = mapped_column(Integer)
    gqa_ratio: Mapped[int] = mapped_column(Integer, index=True)
    head_dim_qk: Mapped[int] = mapped_column(Integer, index=True)
    head_dim_v: Mapped[int] = mapped_column(Integer)
    with_attn_scale: Mapped[bool] = mapped_column(Boolean)
    with_attn_bias: Mapped[bool] = mapped_column(Boolean)
    causal: Mapped[bool] = mapped_column(Boolean, index=True)
    has_prefix_offset: Mapped[bool] = mapped_column(Boolean)
    kv_cache: Mapped[bool] = mapped_column(Boolean, index=True)
    trans_q: Mapped[bool] = mapped_column(Boolean)
    trans_k: Mapped[bool] = mapped_column(Boolean)
    trans_v: Mapped[bool] = mapped_column(Boolean)
    trans_o: Mapped[bool] = mapped_column(Boolean)
    return_lse: Mapped[bool] = mapped_column(Boolean)
    split_kv: Mapped[int] = mapped_column(Integer, index=True)
    data_seed: Mapped[int] = mapped_column(BigInteger)
    # Revision 0007: the input regime (attnconfig.regimes), a column so failures filter and
    # group by it; the config JSON leaves out the default, `normal`.
    data_regime: Mapped[str] = mapped_column(String(16), index=True, default="normal", server_default="normal")

    # The result (null while queued).
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    outcome: Mapped[str | None] = mapped_column(String(16), index=True)
    failed_gate: Mapped[str | None] = mapped_column(String(16), index=True)
    detail: Mapped[str | None] = mapped_column(Text)
    not_applicable_reason: Mapped[str | None] = mapped_column(String(64))
    rms_threshold: Mapped[float | None] = mapped_column(Float)
    threshold_reason: Mapped[str | None] = mapped_column(String(32))
    gates: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    backend: Mapped[str | None] = mapped_column(String(16))
    device: Mapped[str | None] = mapped_column(String(200))
    driver_version: Mapped[str | None] = mapped_column(String(64))
    compiler_version: Mapped[str | None] = mapped_column(String(64))
    variant: Mapped[str | None] = mapped_column(String(200))
    block_n: Mapped[int | None] = mapped_column(Integer)
    source_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    compile_s: Mapped[float | None] = mapped_column(Float)
    inputs_s: Mapped[float | None] = mapped_column(Float)
    run_s: Mapped[float | None] = mapped_column(Float)
    reference_s: Mapped[float | None] = mapped_column(Float)
    verify_s: Mapped[float | None] = mapped_column(Float)
    total_s: Mapped[float | None] = mapped_column(Float)

    # docs/spec.md §4 metrics (attnconfig.outcomes.METRIC_KEYS); null where not applicable.
    out_rms: Mapped[float | None] = mapped_column(Float)
    out_row_err: Mapped[float | None] = mapped_column(Float)
    out_max_abs: Mapped[float | None] = mapped_column(Float)
    out_max_rel: Mapped[float | None] = mapped_column(Float)
    out_err_ratio: Mapped[float | None] = mapped_column(Float)
    lse_rms: Mapped[float | None] = mapped_column(Float)
    lse_max_abs: Mapped[float | None] = mapped_column(Float)
    lse_row_err: Mapped[float | None] = mapped_column(Float)
    partials_row_err: Mapped[float | None] = mapped_column(Float)
    partials_lse_max_abs: Mapped[float | None] = mapped_column(Float)
    out_nonfinite: Mapped[int | None] = mapped_column(BigInteger)
    lse_inf_mismatch: Mapped[int | None] = mapped_column(BigInteger)
    lse_nonfinite: Mapped[int | None] = mapped_column(BigInteger)
    partials_invalid_bad: Mapped[int | None] = mapped_column(BigInteger)
    partials_nonfinite: Mapped[int | None] = mapped_column(BigInteger)
    # Revision 0007: the numeric facts of the run's inputs and reference (reference.facts,
    # fact_* keys), what the coverage report buckets; null where the config did not run.
    facts: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    reproducer: Mapped[str | None] = mapped_column(Text)
    # Revision 0010: the kernel that ran it, name and version (kernels/plugins); null: rows
    # stored before, all of the project's own kernels.
    kernel: Mapped[str | None] = mapped_column(String(200))
    kernel_version: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Revision 0004: worker processes that began running this config. A process that dies in a
    # config (a crash in a driver, the OOM killer) leaves it queued with one more start, so a
    # config that kills every process that runs it is stored once it has used up its starts
    # instead of being delivered forever (workers/execute.py MAX_STARTS).
    starts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The outbox (revision 0005): null while the config is committed but not
    # yet published to the broker; set when its task is published. `enqueues` counts the
    # publications (the first, and each requeue of a task that vanished from the broker).
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    enqueues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")



class Worker(Base):
    """A registered Celery worker (one per GPU, or one for the cpu queue) and its heartbeat."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)  # Celery node name, e.g. gpu0@host
    queue: Mapped[str] = mapped_column(String(64), index=True)  # the broker queue it consumes
    backend: Mapped[str] = mapped_column(String(16))  # what it really runs: cpu, cuda, hip
    gpu: Mapped[int | None] = mapped_column(Integer)  # the --gpu index it was pinned to
    concurrency: Mapped[int] = mapped_column(Integer, default=1)
    device: Mapped[str | None] = mapped_column(String(200))
    total_memory: Mapped[int | None] = mapped_column(BigInteger)  # bytes; None without a GPU
    driver_version: Mapped[str | None] = mapped_column(String(64))
    compiler_version: Mapped[str | None] = mapped_column(String(64))
    arch: Mapped[str | None] = mapped_column(String(64))
    versions: Mapped[dict[str, Any]] = mapped_column(JSON)  # python, attnsweep, celery, numpy...
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SourceBundle(Base):
    """kernels/src at some revision, stored once per content (the key is its KernelSource hash)."""

    __tablename__ = "source_bundles"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    files: Mapped[dict[str, str]] = mapped_column(JSON)  # file name in kernels/src -> text
    size_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class CiDelivery(Base):
    """A webhook delivery (X-GitHub-Delivery) that started a sweep: a replay starts nothing new."""

    __tablename__ = "ci_deliveries"
    __table_args__ = (UniqueConstraint("body_sha256", name="uq_ci_deliveries_body_sha256"),)

    delivery_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    event: Mapped[str] = mapped_column(String(32))
    # sha256 of the signed body (revision 0005): what the signature covers,
    # so the same signed body under a new delivery id is a replay too.
    body_sha256: Mapped[str | None] = mapped_column(String(64))
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class SweepTriage(Base):
    """Revision 0006: the triage of one finished sweep (triage/): pending until a worker (or the
    embedded runner) computes it, then done with its clusters, or failed with the reason. A
    triage that fails never changes the sweep's own status."""

    __tablename__ = "sweep_triage"

    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)  # pending, running, done, failed
    error: Mapped[str | None] = mapped_column(Text)
    runs: Mapped[int | None] = mapped_column(Integer)  # real runs spent shrinking and classifying
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Set when its task is published to the broker (null: not yet, the reconciler publishes it).
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Cluster(Base):
    """One bug of a sweep as its triage found it: the failures that share a signature and an
    explanation, the smallest config that still fails that way, and how it repeats."""

    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("sweep_id", "signature", name="uq_clusters_sweep_signature"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)  # 0 for the largest cluster
    signature: Mapped[str] = mapped_column(String(200))  # outcome/gate/location (triage.signature.Signature.label)
    size: Mapped[int] = mapped_column(Integer)
    signatures: Mapped[dict[str, Any]] = mapped_column(JSON)  # label -> members with it
    explanation: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_hashes: Mapped[list[str]] = mapped_column(JSON)  # the member configs (ConfigRun.config_hash)
    example_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    minimal_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reproducer: Mapped[str | None] = mapped_column(Text)
    # outcome/gate/location the reproducer gave when the triage ran it after making it
    reproducer_signature: Mapped[str | None] = mapped_column(String(200))
    classification: Mapped[str | None] = mapped_column(String(32))
    classification_detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    first_bad_commit: Mapped[str | None] = mapped_column(String(64))
    runs: Mapped[int | None] = mapped_column(Integer)  # real runs its shrink and classification spent
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Bisection(Base):
    """Revision 0008: the search for the first commit of a kernel repository at which configs fail
    (triage/bisect.py), asked for by POST /bisect or started for each bug (cluster) of a CI push
    whose sweep has new failures. A worker claims it (queued -> running, `attempts` + 1: the claim's token), writes
    the commits tested so far with each heartbeat, and stores the result (done) or the reason it
    has none (error) once, under its own claim."""

    __tablename__ = "bisections"
    # One bisection per cluster of a CI sweep (the one without clusters: cluster_rank null, and
    # workers/bisect.py plans none for a sweep that has any).
    __table_args__ = (UniqueConstraint("sweep_id", "cluster_rank", name="uq_bisections_sweep_cluster"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # queued, running, done, error
    # The request: the repository (a path or a URL as the worker reads it), the two ends as given,
    # the configs and how they run.
    repo: Mapped[str] = mapped_column(String(1000))
    good: Mapped[str] = mapped_column(String(255))
    bad: Mapped[str] = mapped_column(String(255))
    backend: Mapped[str] = mapped_column(String(16))
    configs: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    defects: Mapped[list[str]] = mapped_column(JSON)
    err_ratio_gate: Mapped[float | None] = mapped_column(Float)
    # The result (BisectResult.to_dict); `tested` grows while it runs.
    first_bad: Mapped[str | None] = mapped_column(String(64))
    steps: Mapped[int | None] = mapped_column(Integer)
    skipped: Mapped[list[str] | None] = mapped_column(JSON)
    tested: Mapped[list[list[str]] | None] = mapped_column(JSON)
    candidates: Mapped[list[str] | None] = mapped_column(JSON)
    runs: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    # A CI push's bisection: the repository (owner/name), the pushed commit and its sweep.
    repository: Mapped[str | None] = mapped_column(String(200))
    commit_sha: Mapped[str | None] = mapped_column(String(64), index=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    # The sweep's cluster it bisects (Cluster.rank and Cluster.signature: a triage computed again
    # replaces the rows, so their ids do not last); null when the sweep's failures had no clusters.
    cluster_rank: Mapped[int | None] = mapped_column(Integer)
    cluster_signature: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Revision 0009: the name of the API token that asked for it ("webhook": a CI push's); null
    # where authentication was off.
    submitted_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Set when its task is published to the broker (null: not yet, the reconciler publishes it).
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
