"""submit: one use case for every sweep; its limits, its embedded run, and the CI request it builds."""
from __future__ import annotations

import pytest

from settings import Settings
from submit.ci import CiSpecError, ci_spec
from submit.sweep import SubmitError, checked_spec, run_sweep
from sweeps.spec import SweepSpec


def test_the_service_limits_refuse_a_sweep_naming_the_field():
    settings = Settings(max_sweep_configs=10, max_draws=1000)
    with pytest.raises(SubmitError) as exc:
        checked_spec(SweepSpec(samples=11, backend="cpu"), None, settings)
    assert exc.value.problems[0][0] == "samples" and "ATTNSWEEP_MAX_SWEEP_CONFIGS" in exc.value.problems[0][1]
    with pytest.raises(SubmitError, match="max_draws=5000"):
        checked_spec(SweepSpec(samples=5, backend="cpu", max_draws=5000), None, settings)
    # The default draw budget (1000 x samples) is cut to the cap rather than refused.
    assert checked_spec(SweepSpec(samples=5, backend="cpu"), None, settings).max_draws == 1000


@pytest.mark.timeout(120)
def test_run_sweep_plans_commits_and_executes_in_the_embedded_pool(sqlite_url):
    from store import repo
    from store.db import session_scope, unit_of_work
    from store.migrate import upgrade

    upgrade(sqlite_url)
    seen, results = [], []

    from contextlib import contextmanager

    @contextmanager
    def started(sweep_id, total):  # noqa: ANN001, ANN202
        with session_scope(sqlite_url) as s:   # committed before it runs
            seen.append((sweep_id, total, repo.sweep_counts(s, sweep_id)["configs_total"]))
        yield results.append

    with unit_of_work(sqlite_url) as session:
        sweep_id = run_sweep(session, SweepSpec(samples=3, seed=5, backend="cpu"), backend="cpu",
                             device_total_memory=None, device=None, started=started)
    assert seen == [(sweep_id, 3, 3)] and len(results) == 3
    with session_scope(sqlite_url) as s:
        assert repo.sweep_status(s, sweep_id) == "done" and not repo.queued_configs(s, sweep_id)


def test_a_sampling_that_finds_too_few_configs_is_refused_before_anything_is_stored(sqlite_url):
    from store.db import session_scope, unit_of_work
    from store.migrate import upgrade
    from store.models import Sweep

    upgrade(sqlite_url)
    spec = SweepSpec(samples=50, seed=1, backend="cpu", max_tokens=1, max_draws=100)
    with pytest.raises(SubmitError) as exc, unit_of_work(sqlite_url) as session:
        run_sweep(session, spec, backend="cpu", device_total_memory=None, device=None)
    assert exc.value.problems[0][0] == "max_draws"
    with session_scope(sqlite_url) as s:
        assert s.query(Sweep).count() == 0


def test_the_ci_request_is_validated_where_ci_sweeps_are_built():
    assert ci_spec(Settings(ci_spec={"dtypes": ["f16"]}, ci_samples=7)).samples == 7
    with pytest.raises(CiSpecError, match="ATTNSWEEP_CI_SPEC"):
        ci_spec(Settings(ci_spec={"dtypes": ["f64"]}))
    # The settings themselves refuse what has a setting of its own, importing nothing to do it.
    with pytest.raises(ValueError, match="ATTNSWEEP_CI_SAMPLES"):
        Settings(ci_spec={"samples": 3})
