"""Triage of a stored sweep: its failures clustered and explained, each cluster's smallest
member shrunk to a minimal reproducer and that reproducer classified.

The runs are real: on the sweep's backend (the one its results name, unless another is asked
for), with its defect switches and its source bundle, under the sweep policy's gates
(err_ratio_gate included) for each config run. Storing clusters and serving them are the
callers' (triage_sweep returns JSON-able dataclasses: Cluster.to_dict).
"""
from __future__ import annotations

import shlex
from collections import Counter
from typing import Any, Sequence

from attnconfig import parse_config
from attnconfig.outcomes import METRIC_KEYS
from kernelsrc.build import resolve_kernel
from settings import Settings, get_settings
from store.bundles import load_bundle
from store.db import Session
from store.models import Sweep
from store.sweeps import get_sweep, judged_backends_and_reproducers, judged_runs
from sweeps.result import at_commit, reproducer_command
from triage.attempt import Runner
from triage.classify import DEFAULT_REPEATS, DEFAULT_SEEDS, classify
from triage.cluster import Cluster, ResultRow, cluster_results
from triage.shrink import DEFAULT_MAX_RUNS, DEFAULT_MAX_SECONDS, shrink


class SweepNotFound(LookupError):
    pass


def sweep_rows(session: Session, sweep_id: int) -> list[ResultRow]:
    """The sweep's judged configs (queued ones have no outcome yet and are left out)."""
    runs = judged_runs(session, sweep_id)
    return [ResultRow(parse_config(r.config), r.outcome, r.failed_gate, r.variant, r.block_n,
                      {k: getattr(r, k) for k in METRIC_KEYS}, r.gates, r.detail) for r in runs]


def sweep_defects(sweep: Sweep, reproducers: Sequence[str | None]) -> frozenset[str]:
    """The defect switches the sweep ran with: its request's (service sweeps store them), else
    the `--defect` options its reproducers carry (embedded sweeps store them there only)."""
    if sweep.request and sweep.request.get("defects"):
        return frozenset(sweep.request["defects"])
    for line in reproducers:
        if line:
            words = shlex.split(line)
            return frozenset(words[i + 1] for i, w in enumerate(words[:-1]) if w == "--defect")
    return frozenset()


def sweep_runner(session: Session, sweep_id: int, backend: str | None = None, *,
                 time_limit_s: float | None = 30.0, settings: Settings | None = None) -> Runner:
    """A Runner that runs configs as the sweep did: backend, defects, source bundle, err_ratio gate."""
    sweep = get_sweep(session, sweep_id)
    if sweep is None:
        raise SweepNotFound(f"sweep {sweep_id}: no such sweep")
    stored = judged_backends_and_reproducers(session, sweep_id)
    if backend is None:
        named = Counter(b for b, _ in stored if b)
        backend = named.most_common(1)[0][0] if named else sweep.backend
    source = load_bundle(session, sweep.source_hash) if sweep.source_hash else None
    request = sweep.request or {}
    # A CI sweep of a commit with attnsweep.toml: its plug-in as built on this host (a build
    # that failed leaves `commit:SHA`, whose runs are then `error` as the sweep's were).
    kernel, _unbuilt = resolve_kernel(sweep.kernel, settings or get_settings())
    return Runner(backend, sweep_defects(sweep, [r for _, r in stored[:1]]), source,
                  err_ratio_gate=request.get("err_ratio_gate"), time_limit_s=time_limit_s, kernel=kernel)


def triage_clusters(clusters: list[Cluster], runner: Runner, *, shrink_configs: bool = True, classify_configs: bool = True,
                    max_runs: int = DEFAULT_MAX_RUNS, max_seconds: float = DEFAULT_MAX_SECONDS,
                    repeats: int = DEFAULT_REPEATS, seeds: Sequence[int] = DEFAULT_SEEDS,
                    max_clusters: int | None = None, commit: str | None = None) -> list[Cluster]:
    """Shrink each cluster's cheapest member and classify the result, in place; each gets the
    reproducer of its smallest config (at `commit` when the sweep tested one). Only the first
    `max_clusters` (the largest) are shrunk and classified when given, so a sweep with many
    clusters costs a bounded number of runs.

    Shrinking and classification keep the signature that member failed with in the sweep, not
    the cluster's: a cluster that spans kernel families holds members whose location differs
    from its own, and the member can only reproduce what it showed."""
    for i, cluster in enumerate(clusters):
        example = cluster.example()
        start, target = example.config, example.signature
        work = max_clusters is None or i < max_clusters
        if shrink_configs and work:
            shrunk = shrink(start, runner, target, max_runs=max_runs, max_seconds=max_seconds)
            cluster.minimal_config, cluster.shrink_runs = shrunk.minimal_config, shrunk.runs
        if classify_configs and work:
            # The sweep saw the start fail with `target`, the shrink every config it kept.
            cluster.classification = classify(cluster.minimal_config or start.to_dict(), runner, target,
                                              repeats=repeats, seeds=seeds, failed_before=True)
        smallest = parse_config(cluster.minimal_config) if cluster.minimal_config is not None else start
        line = reproducer_command(smallest, runner.backend_name, runner.gates(smallest), runner.defects, runner.kernel)
        cluster.reproducer = at_commit(line, commit) if commit else line
        if work and (shrink_configs or classify_configs):
            # The command is checked once made: run as it says (the config, the gates it
            # carries, the backend and defects), and what it gave is stored with it.
            cluster.reproducer_signature = runner.run(parse_config(smallest.to_compact_json())).signature
    return clusters


def triage_sweep(session: Session, sweep_id: int, backend: str | None = None, *, shrink_configs: bool = True,
                 classify_configs: bool = True, max_runs: int = DEFAULT_MAX_RUNS,
                 max_seconds: float = DEFAULT_MAX_SECONDS, time_limit_s: float | None = 30.0,
                 repeats: int = DEFAULT_REPEATS, seeds: Sequence[int] = DEFAULT_SEEDS,
                 max_clusters: int | None = None, settings: Settings | None = None) -> list[Cluster]:
    """The clusters of a stored sweep's failures, largest first, each explained and (by default)
    with a shrunk reproducer and its classification. Raises SweepNotFound."""
    runner = sweep_runner(session, sweep_id, backend, time_limit_s=time_limit_s, settings=settings)
    clusters = cluster_results(sweep_rows(session, sweep_id))
    commit = get_sweep(session, sweep_id).commit_sha
    try:
        return triage_clusters(clusters, runner, shrink_configs=shrink_configs, classify_configs=classify_configs,
                               max_runs=max_runs, max_seconds=max_seconds, repeats=repeats, seeds=seeds,
                               max_clusters=max_clusters, commit=commit)
    finally:
        runner.close()


def clusters_json(clusters: Sequence[Cluster]) -> dict[str, Any]:
    return {"clusters": [c.to_dict() for c in clusters]}
