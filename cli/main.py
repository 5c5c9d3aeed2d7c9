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
from cli.common import console, database_url, db_source, fail, option_text, redacted
from cli.errors import EXIT_STATUS, INFRASTRUCTURE, INTERRUPTED, USAGE, OneLineErrors, first_line, server_answered
from cli.options import OPTION_FIELDS, OPTION_NAMES, SweepOptions, build_spec, defect_option, sweep_options
from cli.failures import app as failures_app
from cli.kernels import app as kernels_app
from cli.triage import app as triage_app

# pretty_exceptions off: OneLineErrors turns every error into one line; typer's panels never show.
app = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Sweep split-KV attention kernels against a host reference.", epilog=EXIT_STATUS)
db_app = typer.Typer(no_args_is_help=True, help="Database schema (Alembic migrations).")
app.add_typer(db_app, name="db")
app.add_typer(triage_app)  # triage, shrink, bisect (cli/triage.py)
app.add_typer(kernels_app)  # kernels, compare (cli/kernels.py)
app.add_typer(failures_app)  # failures (cli/failures.py)

BACKENDS = ("auto", "cpu", "cuda", "hip", "hostemu")


def _migrate(url: str, source: str = "--db") -> None:
    """Bring the store to the newest schema. A server that refuses (no such database, bad
    password) is a usage mistake, exit 2; one that cannot be reached is an outage, exit 3."""
    from store.db import DBAPIError
    from store.migrate import upgrade

    try:
        upgrade(url)
    except DBAPIError as exc:
        if server_answered(exc) or "unable to open" in str(exc):
            fail(f"{source}: cannot open the database {redacted(url)}: {first_line(exc)}")
        fail(f"{source}: the database {redacted(url)} cannot be reached: {first_line(exc)}; try again later",
             INFRASTRUCTURE)


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
    from cli.report import print_summary
    from cli.progress import progress_bar
    from store.db import unit_of_work
    from submit.report import run_report
    from submit.sweep import SubmitError, run_sweep
    from submit.target import probe_target

    spec = _spec(options)
    failing = _fail_on(fail_on)
    for path, option in ((report_json, "--report-json"), (junit_xml, "--junit-xml")):
        if path is not None and not path.resolve().parent.is_dir():
            fail(f"{option}: the folder {str(path.parent)!r} does not exist")
    url = database_url(db)
    _migrate(url, db_source(db))  # before the backend starts: a wrong --db is found in a second, not after a compile
    defects = frozenset(options.defects)
    target = _target(lambda: probe_target(spec.kernel, spec.backend, defects, gpus=gpus, jobs=jobs, sanitize=sanitize,
                                          sanitize_share=sanitize_share))
    info = target.info
    stored: list[int] = []  # the sweep id once committed: what an interruption leaves stored

    @contextmanager
    def started(sweep_id: int, total: int) -> Iterator[Callable[[Any], None]]:
        stored.append(sweep_id)
        kernel = f", kernel {info.kernel} {info.kernel_version}" if spec.kernel != "attnsweep" else ""
        console.print(f"sweep {sweep_id}: seed {spec.resolved_seed()}{kernel}, backend {info.backend} on {info.device}"
                      + (f", GPUs {','.join(map(str, target.gpus))}, {target.jobs} processes" if target.gpus else ""),
                      highlight=False, soft_wrap=True)
        with progress_bar(console, total, "configs") as advance:
            yield lambda r: advance(r.outcome)

    @contextmanager
    def triaging(sweep_id: int) -> Iterator[None]:
        console.print(f"sweep {sweep_id}: triage of its failures (--no-triage skips it)", highlight=False)
        yield

    t0 = time.perf_counter()
    with unit_of_work(url) as session:   # the run's one session: each step commits its own transaction
        try:
            sweep_id = run_sweep(session, spec, backend=info.backend, device_total_memory=info.total_memory,
                                 device=info.device, defects=defects, sanitize=(sanitize, sanitize_share) if sanitize else None,
                                 jobs=target.jobs, gpus=target.gpus, time_limit_s=time_limit, started=started,
                                 triage=not no_triage, triaging=triaging, kernel_identity=(info.kernel, info.kernel_version))
        except SubmitError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            fail(_interrupted(session, stored[0] if stored else None), INTERRUPTED)
        done = run_report(session, sweep_id, time.perf_counter() - t0, triaged=not no_triage, junit=bool(junit_xml))
    report = done.report
    print_summary(Console(), sweep_id, report, done.by_dtype)
    if done.triage is not None:
        _print_bugs(done.triage)
    if report_json:
        report_json.write_text(json.dumps(report, indent=2) + "\n")
    if junit_xml:
        junit_xml.write_bytes(done.junit)
    bad = {o: n for o, n in report["outcomes"].items() if o in failing and n}
    if bad:
        console.print("failing outcomes (--fail-on): " + ", ".join(f"{o} {n}" for o, n in bad.items())
                      + f"; `attnsweep failures {sweep_id}` lists them", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _interrupted(session: Any, sweep_id: Optional[int]) -> str:
    """What an interrupted `run` leaves stored, read back from the store."""
    from submit.report import stored_state

    if sweep_id is None:
        return "interrupted before the sweep was stored: nothing stored"
    status, done, total = stored_state(session, sweep_id)
    if status == "done":
        return (f"interrupted during the triage: sweep {sweep_id} is stored done ({done} configs); "
                f"`attnsweep triage {sweep_id}` triages it")
    return (f"interrupted: sweep {sweep_id} is stored {status} with {done} of {total} configs run; "
            f"`attnsweep failures {sweep_id}` lists what failed so far")


def _target(probe: Callable[[], Any]) -> Any:
    """probe() (submit.target), its refusal one line: a usage mistake, or a device that is not there."""
    from submit.target import TargetError

    try:
        return probe()
    except TargetError as exc:
        fail(str(exc), INFRASTRUCTURE if exc.infrastructure else USAGE)


def _print_bugs(triaged: dict[str, Any]) -> None:
    from cli.triage import bug_lines

    out = Console(soft_wrap=True)
    if triaged["status"] != "done":
        out.print(f"triage {triaged['status']}: {triaged['error'] or ''}", highlight=False, markup=False)
        return
    for line in bug_lines(triaged["clusters"]):
        out.print(line, highlight=False, markup=False)


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
    defect: list[str] = defect_option(),
    kernel: str = typer.Option("attnsweep", "--kernel", help="the kernel under test (attnsweep kernels lists them; "
                                                             "module:attr, path/file.py:attr, so:PATH)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object (outcome, failed_gate, "
                                                       "detail, metrics, gates, timings, ...) instead of the verdict line"),
) -> None:
    """Run one config with the strict verifier defaults (or the gates a reproducer carries) and
    print its verdict in one line: the outcome, the gate that failed and the metric against its bound.

    Exit status: 0 when it passes, 1 when it does not, 2 on a usage mistake."""
    from sweeps.policy import gates_for
    from sweeps.runner import run_config

    text = option_text(config, "--config")
    from submit.target import load_backend

    be = _target(lambda: load_backend(kernel, backend, frozenset(defect)))
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
    if not as_json:
        gate = f" (gate {result.failed_gate})" if result.failed_gate else ""
        why = result.detail or result.not_applicable_reason or ""
        print(f"{result.outcome}{gate}{': ' + why.splitlines()[0] if why else ''} [backend {result.backend}, "
              f"split_kv {cfg.split_kv}]")
        raise typer.Exit(0 if result.outcome == "pass" else 1)
    print(json.dumps({
        "outcome": result.outcome, "failed_gate": result.failed_gate, "detail": result.detail, "split_kv": cfg.split_kv,
        "not_applicable_reason": result.not_applicable_reason, "backend": result.backend, "device": result.device,
        "kernel": result.kernel, "kernel_version": result.kernel_version,
        "variant": result.variant, "block_n": result.block_n, "gates": result.gates,
        "metrics": result.metrics, "timings": result.timings,
    }, indent=2, default=str))
    raise typer.Exit(0 if result.outcome == "pass" else 1)


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

    from store.migrate import is_current

    if not is_current(database_url(None)):
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
    from store.db import session_factory
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
    database_url(None)  # names ATTNSWEEP_DATABASE_URL in the line of a database that cannot be reached (exit 3)
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
