"""The `attnsweep` command. Service modules (api, workers) are imported only by their commands."""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.console import Console

from attnconfig import ConfigError, parse_config
from cli.common import console, database_url, db_source, fail, option_text
from cli.options import OPTION_FIELDS, OPTION_NAMES, SweepOptions, build_spec, defects_help, sweep_options
from cli.kernels import app as kernels_app
from cli.triage import app as triage_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Sweep split-KV attention kernels against a host reference.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema (Alembic migrations).")
app.add_typer(db_app, name="db")
app.add_typer(triage_app)  # triage, shrink, bisect (cli/triage.py)
app.add_typer(kernels_app)  # kernels, compare (cli/kernels.py)

BACKENDS = ("auto", "cpu", "cuda", "hip", "hostemu")


def _migrate(url: str, source: str = "--db") -> None:
    """Bring the store to the newest schema; a database that cannot be opened is one line, exit 2."""
    from sqlalchemy.exc import DBAPIError

    from store.migrate import upgrade

    try:
        upgrade(url)
    except DBAPIError as exc:
        fail(f"{source}: cannot open the database {_redacted(url)}: {_first_line(exc.orig or exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if "FATAL:" in text:  # libpq's reason (no such database, bad password) without the connection preamble
        return text.split("FATAL:", 1)[1].strip().splitlines()[0]
    return text.splitlines()[-1].strip() if text.startswith("(") else (text.splitlines() or [type(exc).__name__])[0]


def _redacted(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as given
        return url


def _version_callback(value: bool) -> None:
    if value:
        from importlib import metadata

        try:
            version = metadata.version("attnsweep")
        except metadata.PackageNotFoundError:
            version = "0+unknown"
        print(f"attnsweep {version}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="print the installed version and exit"),
) -> None:
    """Sweep split-KV attention kernels against a host reference."""


DEFAULT_FAIL_ON = "fail,nan,fault,unsafe,error,timeout"


def _fail_on(text: str) -> frozenset[str]:
    from attnconfig.outcomes import OUTCOMES

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in OUTCOMES]
    if bad or not names:
        fail(f"--fail-on {text!r}: {'unknown outcome ' + repr(bad[0]) if bad else 'name at least one outcome'}; "
             f"outcomes are {', '.join(OUTCOMES)}")
    return frozenset(names)


def _spec(options: SweepOptions):
    try:
        return build_spec(**options.fields)
    except ConfigError as exc:
        # The request model names its fields as the REST body does (ranges.g); say the option.
        fail("; ".join(f"--range {f.removeprefix('ranges.')}: {r}" if f.startswith("ranges.")
                       else f"{_option(f)}: {r}" for f, r in exc.problems))


def _option(field: str) -> str:
    name = field.split(".", 1)[0]  # dtypes.0: the first entry of --dtypes
    if name in OPTION_NAMES:
        return OPTION_NAMES[name]  # data_regimes.sink: --regimes (the rule names the regime)
    return "--" + name.replace("_", "-") if name in OPTION_FIELDS else field


DB = typer.Option(None, "--db", help="SQLite path or database URL (default: ATTNSWEEP_DATABASE_URL, else ./attnsweep.db)")


@app.command()
@sweep_options()
def run(
    options: SweepOptions,
    db: Optional[str] = DB,
    report_json: Optional[Path] = typer.Option(None, "--report-json", help="write the sweep report (docs/spec.md §8 keys) here"),
    junit_xml: Optional[Path] = typer.Option(None, "--junit-xml", help="write the sweep as JUnit XML here (one testcase per config; failing outcomes are failures or errors), for CI test reports"),
    fail_on: str = typer.Option(DEFAULT_FAIL_ON, "--fail-on", help="comma-separated outcomes that make the exit status 1 when any config ends in one (oom and not_applicable count only when named)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="local worker processes (embedded mode; default 1, with --gpus one per entry), dealt round-robin over --gpus"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="all, or GPU indices like 0,1: spread the sweep over these GPUs, each process pinned to one (repeats share a GPU)"),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", min=0, help="seconds a config may run before it is stored as timeout and its process replaced (default: ATTNSWEEP_CONFIG_TIME_LIMIT_S; 0: none)"),
    sanitize: Optional[str] = typer.Option(None, "--sanitize", help="run configs under compute-sanitizer: memcheck|racecheck|synccheck|initcheck (cuda only); a finding stores the config as unsafe"),
    sanitize_share: float = typer.Option(1.0, "--sanitize-share", help="with --sanitize: the share of configs sanitized, stratified by kernel variant (every variant at least once)"),
    no_triage: bool = typer.Option(False, "--no-triage", help="skip the triage after the sweep (clustering its failures by bug, shrinking and classifying each; bounded by ATTNSWEEP_TRIAGE_*)"),
) -> None:
    """Sample, prefilter, run and verify a sweep in worker processes of this machine; store every
    result; then triage its failures (one line per bug, stored for `attnsweep triage`).

    Exit status: 0 when no config ended in an outcome of --fail-on, 1 when one did, 2 on a usage
    mistake (the line on stderr names it)."""
    from cli.report import print_summary, sweep_report
    from cli.progress import progress_bar
    from submit.sweep import SubmitError, run_sweep
    from workers.sanitize import check_request

    spec = _spec(options)
    failing = _fail_on(fail_on)
    for path, option in ((report_json, "--report-json"), (junit_xml, "--junit-xml")):
        if path is not None and not path.resolve().parent.is_dir():
            fail(f"{option}: the folder {str(path.parent)!r} does not exist")
    url = database_url(db)
    _migrate(url, db_source(db))  # before the backend starts: a wrong --db is found in a second, not after a compile
    defects = frozenset(options.defects)
    if (jobs or 0) > 1 or gpus is not None:
        from workers.embedded import start_pool_server

        start_pool_server()  # its imports overlap the backend's start and the planning below
    be = _kernel_backend(spec.kernel, spec.backend, defects)
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

    @contextmanager
    def started(sweep_id: int, total: int) -> Iterator[Callable[[Any], None]]:
        kernel = f", kernel {info.kernel} {info.kernel_version}" if spec.kernel != "attnsweep" else ""
        console.print(f"sweep {sweep_id}: seed {spec.resolved_seed()}{kernel}, backend {info.backend} on {info.device}"
                      + (f", GPUs {','.join(map(str, gpu_list))}, {jobs} processes" if gpu_list else ""),
                      highlight=False, soft_wrap=True)
        be.close()
        with progress_bar(console, total, "configs") as advance:
            yield lambda r: advance(r.outcome)

    @contextmanager
    def triaging(sweep_id: int) -> Iterator[None]:
        console.print(f"sweep {sweep_id}: triage of its failures (--no-triage skips it)", highlight=False)
        yield

    t0 = time.perf_counter()
    try:
        sweep_id = run_sweep(url, spec, backend=info.backend, device_total_memory=info.total_memory, device=info.device,
                             defects=defects, sanitize=(sanitize, sanitize_share) if sanitize else None, jobs=jobs,
                             gpus=gpu_list, time_limit_s=time_limit, started=started, triage=not no_triage,
                             triaging=triaging, kernel_identity=(info.kernel, info.kernel_version))
    except SubmitError as exc:
        be.close()
        fail(str(exc))
    wall = time.perf_counter() - t0
    report = sweep_report(url, sweep_id, wall)
    print_summary(Console(), url, sweep_id, report)
    if not no_triage:
        _print_bugs(url, sweep_id)
    if report_json:
        report_json.write_text(json.dumps(report, indent=2) + "\n")
    if junit_xml:
        junit_xml.write_bytes(_junit(url, sweep_id))
    bad = {o: n for o, n in report["outcomes"].items() if o in failing and n}
    if bad:
        console.print("failing outcomes (--fail-on): " + ", ".join(f"{o} {n}" for o, n in bad.items())
                      + f"; `attnsweep failures {sweep_id}` lists them", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _kernel_backend(kernel: str, backend: str, defects: frozenset[str]) -> Any:
    """The backend that runs `kernel` (confined where it did not ship); a usage mistake is one line."""
    from isolation.confined import backend_for
    from kernels.backends.base import BackendUnavailable
    from kernels.plugins import KernelSpecError

    try:
        return backend_for(backend, defects, kernel=kernel)
    except KernelSpecError as exc:
        fail(f"--{exc}")
    except (BackendUnavailable, ValueError) as exc:
        fail(f"backend: {exc}")


def _print_bugs(url: str, sweep_id: int) -> None:
    from cli.triage import bug_lines
    from store.clusters import clusters_report
    from store.db import session_scope

    with session_scope(url) as s:
        triaged = clusters_report(s, sweep_id)
    out = Console(soft_wrap=True)
    if triaged["status"] != "done":
        out.print(f"triage {triaged['status']}: {triaged['error'] or ''}", highlight=False, markup=False)
        return
    for line in bug_lines(triaged["clusters"]):
        out.print(line, highlight=False, markup=False)


def _junit(url: str, sweep_id: int) -> bytes:
    from sqlalchemy import select

    from ci.junit import render
    from ci.status import junit_bugs
    from store.db import session_scope
    from store.models import ConfigRun, Sweep

    with session_scope(url) as s:
        runs = s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id).order_by(ConfigRun.seq)).all()
        sweep = s.get(Sweep, sweep_id)
        bugs, summary = junit_bugs(s, sweep)
        return render(sweep, runs, bugs=bugs, summary=summary)


@app.command()
@sweep_options(label=False, defects=False, prior=False)
def sample(
    options: SweepOptions,
    as_json: bool = typer.Option(False, "--json", help="print {configs, filtered, draws} as one JSON object"),
) -> None:
    """Sample and prefilter exactly as `run` would, executing nothing."""
    from sweeps.plan import resolve_budget
    from sweeps.sampler import SamplingExhausted
    from sweeps.sampler import sample as draw

    spec = _spec(options)
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
    backend: str = typer.Option("auto", "--backend", help="auto|cpu|cuda|hip (auto: a usable GPU, else the cpu emulation)"),
    gates: Optional[str] = typer.Option(None, "--gates", help="gates JSON a reproducer carries (default: strict verifier)"),
    defect: list[str] = typer.Option([], "--defect", help=defects_help()),
    kernel: str = typer.Option("attnsweep", "--kernel", help="the kernel under test (attnsweep kernels lists them; "
                                                             "module:attr, path/file.py:attr, so:PATH)"),
) -> None:
    """Run one config with the strict verifier defaults (or the gates a reproducer carries).

    Exit status: 0 when it passes, 1 when it does not, 2 on a usage mistake."""
    from sweeps.policy import gates_for
    from sweeps.runner import run_config

    text = option_text(config, "--config")
    be = _kernel_backend(kernel, backend, frozenset(defect))
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
        "kernel": result.kernel, "kernel_version": result.kernel_version,
        "variant": result.variant, "block_n": result.block_n, "gates": result.gates,
        "metrics": result.metrics, "timings": result.timings,
    }, indent=2, default=str))
    raise typer.Exit(0 if result.outcome == "pass" else 1)


@app.command()
def failures(
    sweep: Optional[int] = typer.Argument(None, min=1, help="sweep id (default: every sweep, newest failures first)"),
    db: Optional[str] = DB,
    outcome: Optional[str] = typer.Option(None, "--outcome", help="only these failing outcomes, comma-separated: fail, nan, fault, unsafe, error, timeout, oom"),
    gate: Optional[str] = typer.Option(None, "--gate", help="only failures charged to these gates, comma-separated: rms, row, lse, partials, err_ratio"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="only these dtypes, comma-separated: f16, bf16, f32, i8"),
    regime: Optional[str] = typer.Option(None, "--regime", help="only these data regimes, comma-separated: normal, sink, "
                                                                "outliers, large_logits, uniform, cancellation"),
    label: Optional[str] = typer.Option(None, "--label", help="only sweeps with this label"),
    limit: int = typer.Option(50, "--limit", min=1, max=1000, help="most failures to list"),
    as_json: bool = typer.Option(False, "--json", help="print {failures: [...], has_more} as one JSON object (the API's failure rows)"),
) -> None:
    """List stored failures: the gate, the metric against its bound, and the command that reproduces each."""
    from api.convert import config_run_public
    from api.errors import ProblemError
    from api.filters import parse_str_match
    from api.convert import gate_check
    from api.schemas.analysis import FailureRow
    from attnconfig.outcomes import FAILING_OUTCOMES
    from store import queries
    from store.db import session_scope
    from store.models import Sweep

    url = database_url(db)
    source = db_source(db)
    if url.startswith("sqlite") and not Path(url.split(":///", 1)[-1]).exists():
        fail(f"{source}: no SQLite store at {url.split(':///', 1)[-1]!r} (a sweep creates it: attnsweep run --db PATH)")
    _migrate(url, source)
    matches = {}
    try:
        for option, column, text, allowed in (("--outcome", "outcome", outcome, FAILING_OUTCOMES),
                                              ("--gate", "failed_gate", gate, None), ("--dtype", "dtype", dtype, None),
                                              ("--regime", "data_regime", regime, None)):
            if text is not None:
                matches[column] = parse_str_match(option, column, text, allowed)
    except ProblemError as exc:
        fail(exc.problems[0][1])
    if sweep is not None:
        matches["sweep_id"] = queries.Match(values=(sweep,))
    with session_scope(url) as s:
        if sweep is not None and s.get(Sweep, sweep) is None:
            fail(f"sweep {sweep}: no such sweep in {_redacted(url)}")
        page = queries.failures(s, queries.ResultFilter(matches=matches, label=label), limit=limit)
        rows = []
        for run, run_label in page.rows:
            public = config_run_public(run, run_label)
            rows.append(FailureRow(**public.model_dump(), check=gate_check(public)))
    if as_json:
        print(json.dumps({"failures": [r.model_dump(mode="json") for r in rows], "has_more": page.has_more}, default=str))
        return
    if not rows:
        console.print("no failures" + (f" in sweep {sweep}" if sweep is not None else ""), highlight=False)
        return
    _print_failures(rows, page.has_more)


def _g(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def _print_failures(rows: list, has_more: bool) -> None:
    from rich.table import Table

    from ci.junit import case_name

    out = Console()
    table = Table(title=f"{len(rows)} failures" + (" (more: raise --limit)" if has_more else ""))
    for column in ("#", "sweep", "outcome", "gate", "metric vs bound", "config"):
        table.add_column(column, overflow="fold")
    for i, r in enumerate(rows, 1):
        c = r.check
        check = f"{c.metric}={_g(c.value)} > {_g(c.bound)}" if c.metric else (c.why or "")
        table.add_row(str(i), str(r.sweep_id), r.outcome or "", c.gate or "", check, case_name(r))
    out.print(table)
    # Reproducers are long; on their own lines they stay copyable whatever the terminal's width.
    out.print("reproducers:", highlight=False)
    for i, r in enumerate(rows, 1):
        out.print(f"#{i}: {r.reproducer or '(none stored)'}", highlight=False, soft_wrap=True, markup=False)


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DB) -> None:
    """Migrate the database to the newest schema revision."""
    url = database_url(db)
    _migrate(url, db_source(db))
    console.print("database is at the newest revision", highlight=False)


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())


# --- service mode: the API and the workers; imported only inside their commands ------
@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 in a container)"),
    port: int = typer.Option(8000, "--port", help="TCP port to listen on"),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes"),
) -> None:
    """Run the HTTP API (settings from ATTNSWEEP_*; the database must be migrated: `attnsweep db upgrade`)."""
    import uvicorn

    from settings import get_settings
    from store.migrate import is_current

    if not is_current(get_settings().database_url):
        fail("the database is not at the newest schema revision: run `attnsweep db upgrade` first")
    uvicorn.run("api.main:create_app", factory=True, host=host, port=port, workers=workers, log_level="info")


@app.command()
@sweep_options()
def submit(
    options: SweepOptions,
    idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key", help="a retried submit with the same key returns the first one's sweep"),
) -> None:
    """Submit a sweep to the service's workers (settings from ATTNSWEEP_*), as POST /sweeps does.

    The same path as the API and the CI webhook: the sweep is committed with its configs, then
    published; with the broker away it stays queued and the workers' reconciler publishes it."""
    from api.schemas.sweeps import SweepAccepted, SweepCreate
    from api.submission import accepted, check_idempotency_key, problem_of
    from api.errors import ProblemError
    from pydantic import ValidationError
    from settings import get_settings
    from store.db import is_unreachable, session_factory
    from store.migrate import is_current
    from submit.sweep import SubmitError, submit_sweep
    from workers.app import create_celery

    spec = _spec(options)
    try:
        # The request rules the API checks beyond the spec (defects known, not repeated).
        SweepCreate.model_validate({**spec.model_dump(exclude_none=True), "defects": options.defects})
    except ValidationError as exc:
        from api.errors import request_problems

        fail("; ".join(f"{f}: {r}" for f, r in request_problems(exc.errors())))
    settings = get_settings()
    try:
        key = check_idempotency_key(idempotency_key)
        if not is_current(settings.database_url):
            fail("the database is not at the newest schema revision: run `attnsweep db upgrade` first")
        with session_factory(settings.database_url)() as session:
            done: SweepAccepted = accepted(submit_sweep(session, create_celery(settings), settings, spec,
                                                        defects=options.defects, idempotency_key=key,
                                                        submitted_by="cli"))
    except SubmitError as exc:
        fail(str(problem_of(exc)))
    except ProblemError as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a database that cannot be reached is one line, not a traceback
        if not is_unreachable(exc):
            raise
        fail(f"database: cannot be reached ({str(exc).splitlines()[0]}); try again later", code=3)
    print(done.model_dump_json())


@app.command()
def worker(
    queue: str = typer.Option(..., "--queue", help="cpu (the cpu backend) or gpu (auto, cuda, hip)"),
    gpu: Optional[int] = typer.Option(None, "--gpu", min=0, help="GPU index this worker owns (sets CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)"),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="processes; keep 1 per GPU"),
    name: Optional[str] = typer.Option(None, "--name", help="worker name (default: QUEUE[GPU]@HOSTNAME)"),
    loglevel: str = typer.Option("INFO", "--loglevel", help="Celery log level: DEBUG, INFO, WARNING, ERROR"),
) -> None:
    """Run a Celery worker for the cpu or gpu queue; it registers its device and heartbeats."""
    if queue not in ("cpu", "gpu"):
        fail(f"--queue {queue!r}: must be cpu or gpu")
    if gpu is not None and queue != "gpu":
        fail("--gpu needs --queue gpu")
    if concurrency > 1:
        from workers.threads import cap_blas_threads

        cap_blas_threads()  # before workers.start imports numpy: the forked children inherit its BLAS
    from settings import get_settings
    from workers.start import WorkerStartError, start_worker

    try:
        start_worker(get_settings(), queue, gpu=gpu, concurrency=concurrency, name=name, loglevel=loglevel)
    except WorkerStartError as exc:
        fail(str(exc))
