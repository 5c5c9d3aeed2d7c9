"""The `attnsweep` command. Service modules (api, workers) are imported only by their commands."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

from attnconfig import ConfigError, parse_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Sweep split-KV attention kernels against a host reference.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema (Alembic migrations).")
app.add_typer(db_app, name="db")
console = Console(stderr=True)

BACKENDS = ("auto", "cpu", "cuda", "hip", "hostemu")


def fail(message: str, code: int = 2) -> NoReturn:
    # One line whatever the terminal's width (soft_wrap), so scripts can grep it; no traceback.
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def _database_url(db: Optional[str]) -> str:
    from core.settings import get_settings

    if db is None:
        return get_settings().database_url
    if "://" in db:
        return db
    return f"sqlite:///{db}"


def _spec(**fields: Any):
    from cli.options import build_spec

    try:
        return build_spec(**fields)
    except ConfigError as exc:
        fail(str(exc))


SAMPLES = typer.Option(50, "--samples", help="configs to run (accepted by every prefilter)")
SEED = typer.Option(None, "--seed", help="sweep seed (default: the ISO week number)")
DTYPES = typer.Option("f16,bf16,f32,i8", "--dtypes", help="comma-separated dtypes to sample")
BACKEND = typer.Option("auto", "--backend", help="auto|cpu|cuda|hip|hostemu (auto: a usable GPU, else the cpu emulation; hostemu: the kernel source run on the CPU)")
LABEL = typer.Option(None, "--label")
MAX_TOKENS = typer.Option(16384, "--max-tokens")
SKV_LIMIT = typer.Option(None, "--splitkv-extra-bytes-limit", help="bytes; default: device memory // 8 in [1, 8] GiB, 1.5 GiB without a GPU")
FLOPS_LIMIT = typer.Option(2e10, "--reference-flops-limit")
BYTES_LIMIT = typer.Option(1 << 30, "--reference-bytes-limit")
RANGES = typer.Option([], "--range", help="override a sampled range, e.g. g=1:64 (repeatable)")


@app.command()
def run(
    samples: int = SAMPLES,
    seed: Optional[int] = SEED,
    dtypes: str = DTYPES,
    backend: str = BACKEND,
    label: Optional[str] = LABEL,
    max_tokens: int = MAX_TOKENS,
    splitkv_extra_bytes_limit: Optional[int] = SKV_LIMIT,
    reference_flops_limit: float = FLOPS_LIMIT,
    reference_bytes_limit: int = BYTES_LIMIT,
    range_: list[str] = RANGES,
    db: Optional[str] = typer.Option(None, "--db", help="SQLite path or database URL (default: ATTNSWEEP_DATABASE_URL, else ./attnsweep.db)"),
    report_json: Optional[Path] = typer.Option(None, "--report-json", help="write the sweep report (SPEC §8 keys) here"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="local worker processes (embedded mode; default 1, with --gpus one per entry), dealt round-robin over --gpus"),
    defect: list[str] = typer.Option([], "--defect", help="compile a known bug into the kernels (proof that sweeps catch it)"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="all, or GPU indices like 0,1: spread the sweep over these GPUs, each process pinned to one (repeats share a GPU)"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", min=0, help="seconds a config may run before it is stored as timeout and its process replaced (default: ATTNSWEEP_CONFIG_TIME_LIMIT_S; 0: none)"),
    sanitize: Optional[str] = typer.Option(None, "--sanitize", help="run configs under compute-sanitizer: memcheck|racecheck|synccheck|initcheck (cuda only); a finding stores the config as unsafe"),
    sanitize_share: float = typer.Option(1.0, "--sanitize-share", help="with --sanitize: the share of configs sanitized, stratified by kernel variant (every variant at least once)"),
) -> None:
    """Sample, prefilter, run and verify a sweep in worker processes of this machine; store every result."""
    from cli.report import print_summary, sweep_report
    from cli.progress import progress_bar
    from kernels import get_backend
    from kernels.backend import BackendUnavailable
    from store.db import session_scope
    from store.migrate import upgrade
    from workers.embedded import execute_sweep
    from sweeps.plan import plan_sweep
    from sweeps.sampler import SamplingExhausted
    from workers.sanitize import check_request

    spec = _spec(samples=samples, seed=seed, dtypes=dtypes, backend=backend, label=label, max_tokens=max_tokens,
                 splitkv_extra_bytes_limit=splitkv_extra_bytes_limit, reference_flops_limit=reference_flops_limit,
                 reference_bytes_limit=reference_bytes_limit, ranges=range_)
    defects = frozenset(defect)
    if (jobs or 0) > 1 or gpus is not None:
        from workers.embedded import start_pool_server

        start_pool_server()  # its imports overlap the backend's start and the planning below
    try:
        be = get_backend(spec.backend, defects=defects)
    except (BackendUnavailable, ValueError) as exc:
        fail(f"backend: {exc}")
    info = be.device_info()
    try:
        check_request(sanitize, info.backend, sanitize_share)
    except ValueError as exc:
        be.close()
        fail("--" + str(exc).replace("sanitize_share", "sanitize-share"))
    gpu_list: list[int] = []
    if gpus is not None:
        from kernels.devices import resolve_gpus

        try:
            gpu_list = resolve_gpus(gpus, be.device_count())
        except ValueError as exc:
            be.close()
            fail(f"{exc} (backend {info.backend})")
    jobs = jobs or max(1, len(gpu_list))
    if jobs < len(gpu_list):
        be.close()
        fail(f"--jobs {jobs}: needs at least one process per --gpus entry ({len(gpu_list)})")
    url = _database_url(db)
    upgrade(url)
    t0 = time.perf_counter()
    try:
        with session_scope(url) as s:
            sweep_id, _ = plan_sweep(s, spec, device_total_memory=info.total_memory, device=info.device,
                                     sanitize=(sanitize, sanitize_share) if sanitize else None,
                                     defects=tuple(sorted(defects)))
    except SamplingExhausted as exc:
        fail(str(exc))
    console.print(f"sweep {sweep_id}: seed {spec.resolved_seed()}, backend {info.backend} on {info.device}"
                  + (f", GPUs {','.join(map(str, gpu_list))}, {jobs} processes" if gpu_list else ""), highlight=False)
    with session_scope(url) as s:
        from store.repo import sweep_counts

        total = sweep_counts(s, sweep_id)["configs_total"]
    be.close()
    with progress_bar(console, total, "configs") as advance:
        execute_sweep(url, sweep_id, info.backend, defects=defects, jobs=jobs, on_result=lambda r: advance(r.outcome),
                      gpus=gpu_list, time_limit_s=time_limit)
    wall = time.perf_counter() - t0
    report = sweep_report(url, sweep_id, wall)
    print_summary(Console(), url, sweep_id, report)
    if report_json:
        report_json.write_text(json.dumps(report, indent=2) + "\n")


@app.command()
def sample(
    samples: int = SAMPLES,
    seed: Optional[int] = SEED,
    dtypes: str = DTYPES,
    backend: str = BACKEND,
    max_tokens: int = MAX_TOKENS,
    splitkv_extra_bytes_limit: Optional[int] = SKV_LIMIT,
    reference_flops_limit: float = FLOPS_LIMIT,
    reference_bytes_limit: int = BYTES_LIMIT,
    range_: list[str] = RANGES,
    as_json: bool = typer.Option(False, "--json", help="print {configs, filtered, draws} as one JSON object"),
) -> None:
    """Sample and prefilter exactly as `run` would, executing nothing."""
    from sweeps.plan import resolve_budget
    from sweeps.sampler import SamplingExhausted
    from sweeps.sampler import sample as draw

    spec = _spec(samples=samples, seed=seed, dtypes=dtypes, backend=backend, label=None, max_tokens=max_tokens,
                 splitkv_extra_bytes_limit=splitkv_extra_bytes_limit, reference_flops_limit=reference_flops_limit,
                 reference_bytes_limit=reference_bytes_limit, ranges=range_)
    total_memory = None
    if spec.backend != "cpu" and spec.splitkv_extra_bytes_limit is None:
        from kernels import get_backend

        total_memory = get_backend(spec.backend).device_info().total_memory
    try:
        result = draw(spec, resolve_budget(spec, total_memory).bytes)
    except SamplingExhausted as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps({"configs": [c.to_dict() for c in result.configs], "filtered": result.filtered, "draws": result.draws}))
        return
    for c in result.configs:
        print(c.to_json())
    console.print(f"{len(result.configs)} configs from {result.draws} draws; filtered: {result.filtered}", highlight=False)


@app.command()
def verify(
    config: str = typer.Option(..., "--config", help="config JSON, or @file; split_kv 0 picks the split count for the GPU (kernels/autosplit.py)"),
    backend: str = typer.Option("auto", "--backend"),
    gates: Optional[str] = typer.Option(None, "--gates", help="gates JSON a reproducer carries (default: strict verifier)"),
    defect: list[str] = typer.Option([], "--defect"),
) -> None:
    """Run one config with the strict verifier defaults (or the gates a reproducer carries)."""
    from kernels import get_backend
    from kernels.backend import BackendUnavailable
    from sweeps.policy import gates_for
    from sweeps.runner import run_config

    text = Path(config[1:]).read_text() if config.startswith("@") else config
    try:
        be = get_backend(backend, defects=frozenset(defect))
    except (BackendUnavailable, ValueError) as exc:
        fail(f"backend: {exc}")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raw = text  # parse_config says what is wrong with it
    try:
        if isinstance(raw, dict):
            from kernels.attention import resolve_config

            cfg = resolve_config(be, raw)
        else:
            cfg = parse_config(raw)
    except ValueError as exc:  # ConfigError included
        be.close()
        fail(str(exc))
    chosen = gates_for(cfg, strict=True)
    if gates:
        try:
            chosen = json.loads(gates)
        except json.JSONDecodeError as exc:
            fail(f"gates: not valid JSON: {exc}")
        missing = {"rms", "row"} - set(chosen) | ({"lse"} - set(chosen) if cfg.return_lse else set())
        if missing:
            fail(f"gates: missing {sorted(missing)} (a reproducer carries rms, rms_reason, row and, with LSE, lse)")
    result = run_config(cfg, be, chosen)
    print(json.dumps({
        "outcome": result.outcome, "failed_gate": result.failed_gate, "detail": result.detail, "split_kv": cfg.split_kv,
        "not_applicable_reason": result.not_applicable_reason, "backend": result.backend, "device": result.device,
        "variant": result.variant, "block_n": result.block_n, "gates": result.gates,
        "metrics": result.metrics, "timings": result.timings,
    }, indent=2, default=str))
    raise typer.Exit(0 if result.outcome == "pass" else 1)


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = typer.Option(None, "--db")) -> None:
    """Migrate the database to the newest schema revision."""
    from store.migrate import upgrade

    url = _database_url(db)
    upgrade(url)
    console.print("database is at the newest revision", highlight=False)


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())


# --- service mode (issue 5): the API and the workers; imported only inside their commands ------
@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 in a container)"),
    port: int = typer.Option(8000, "--port"),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes"),
) -> None:
    """Run the HTTP API (settings from ATTNSWEEP_*; the database must be migrated: `attnsweep db upgrade`)."""
    import uvicorn

    from core.settings import get_settings
    from store.migrate import is_current

    if not is_current(get_settings().database_url):
        fail("the database is not at the newest schema revision: run `attnsweep db upgrade` first")
    uvicorn.run("api.main:create_app", factory=True, host=host, port=port, workers=workers, log_level="info")


@app.command()
def submit(
    samples: int = SAMPLES,
    seed: Optional[int] = SEED,
    dtypes: str = DTYPES,
    backend: str = BACKEND,
    label: Optional[str] = LABEL,
    max_tokens: int = MAX_TOKENS,
    splitkv_extra_bytes_limit: Optional[int] = SKV_LIMIT,
    reference_flops_limit: float = FLOPS_LIMIT,
    reference_bytes_limit: int = BYTES_LIMIT,
    range_: list[str] = RANGES,
    defect: list[str] = typer.Option([], "--defect", help="compile a known bug into the kernels"),
    idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key", help="a retried submit with the same key returns the first one's sweep"),
) -> None:
    """Submit a sweep to the service's workers (settings from ATTNSWEEP_*), as POST /sweeps does.

    The same path as the API and the CI webhook: the sweep is committed with its configs, then
    published; with the broker away it stays queued and the workers' reconciler publishes it."""
    from api.errors import ProblemError
    from api.schemas.sweeps import SweepCreate
    from api.submission import submit_sweep
    from core.settings import get_settings
    from pydantic import ValidationError
    from store.db import is_unreachable, session_factory
    from store.migrate import is_current
    from workers.app import create_celery

    spec = _spec(samples=samples, seed=seed, dtypes=dtypes, backend=backend, label=label, max_tokens=max_tokens,
                 splitkv_extra_bytes_limit=splitkv_extra_bytes_limit, reference_flops_limit=reference_flops_limit,
                 reference_bytes_limit=reference_bytes_limit, ranges=range_)
    try:
        body = SweepCreate.model_validate({**spec.model_dump(exclude_none=True), "defects": defect})
    except ValidationError as exc:
        from api.errors import request_problems

        fail("; ".join(f"{f}: {r}" for f, r in request_problems(exc.errors())))
    settings = get_settings()
    try:
        if not is_current(settings.database_url):
            fail("the database is not at the newest schema revision: run `attnsweep db upgrade` first")
        with session_factory(settings.database_url)() as session:
            accepted = submit_sweep(session, create_celery(settings), settings, body, idempotency_key=idempotency_key)
    except ProblemError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a database that cannot be reached is one line, not a traceback
        if not is_unreachable(exc):
            raise
        fail(f"database: cannot be reached ({str(exc).splitlines()[0]}); try again later", code=3)
    print(accepted.model_dump_json())


@app.command()
def worker(
    queue: str = typer.Option(..., "--queue", help="cpu (the cpu backend) or gpu (auto, cuda, hip)"),
    gpu: Optional[int] = typer.Option(None, "--gpu", min=0, help="GPU index this worker owns (sets CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)"),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="processes; keep 1 per GPU"),
    name: Optional[str] = typer.Option(None, "--name", help="worker name (default: QUEUE[GPU]@HOSTNAME)"),
    loglevel: str = typer.Option("INFO", "--loglevel"),
) -> None:
    """Run a Celery worker for the cpu or gpu queue; it registers its device and heartbeats."""
    if queue not in ("cpu", "gpu"):
        fail(f"--queue {queue!r}: must be cpu or gpu")
    if gpu is not None and queue != "gpu":
        fail("--gpu needs --queue gpu")
    if concurrency > 1:
        from sweeps.threads import cap_blas_threads

        cap_blas_threads()  # before workers.start imports numpy: the forked children inherit its BLAS
    from core.settings import get_settings
    from workers.start import WorkerStartError, start_worker

    try:
        start_worker(get_settings(), queue, gpu=gpu, concurrency=concurrency, name=name, loglevel=loglevel)
    except WorkerStartError as exc:
        fail(str(exc))
