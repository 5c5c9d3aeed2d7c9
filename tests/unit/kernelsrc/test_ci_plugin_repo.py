"""Another project's kernel repository (attnsweep.toml at its root) through the CI webhook and a
bisection, on SQLite with kombu's in-memory broker, every task run in this process as a worker
runs it (tests.unit.api.conftest.run_queued): the commit is built confined and its plug-in swept;
a malformed file or a failing build is said, never swept as the project's own kernels."""
from __future__ import annotations

from sqlalchemy import select

from store.db import session_scope
from store.migrate import upgrade
from store.models import ConfigRun, Sweep
from tests.unit.api.conftest import make_client, make_settings, run_queued
from tests.unit.ci.hooks import deliver, push_payload
from tests.unit.kernelsrc.repos import CAUSAL, PluginRepo, causal_off_by_one
from triage.bisect import bisect
from workers.app import TASK_RUN_CONFIGS

import pytest

pytestmark = pytest.mark.needs_bwrap

SECRET = "unit-webhook-secret-0a47"
SMALL = {"dtypes": ["f16", "f32"], "ranges": {"seq_len_k": [1, 96], "seq_len_q": [1, 4], "g": [1, 2],
                                              "head_dim_qk": [8, 32], "head_dim_v": [8, 32], "split_kv": [1, 4]}}


def _settings(sqlite_url, repo, kernel_cache):  # noqa: ANN001, ANN202
    upgrade(sqlite_url)
    return make_settings(sqlite_url, webhook_secret=SECRET, kernel_repo=str(repo.path), ci_samples=5, ci_backend="cpu",
                         ci_spec=SMALL, kernel_cache=kernel_cache, kernel_repo_cache=kernel_cache.parent / "repos")


def _runs(url: str, sweep_id: int) -> tuple[Sweep, list[ConfigRun]]:
    with session_scope(url) as s:
        sweep = s.get(Sweep, sweep_id)
        runs = list(s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep_id)))
        s.expunge_all()
    return sweep, runs


def test_a_push_of_a_plugin_repository_builds_the_commit_and_sweeps_its_plugin(sqlite_url, tmp_path, kernel_cache):
    repo = PluginRepo(tmp_path / "repo")
    sha = repo.commit("the C-ABI example")
    settings = _settings(sqlite_url, repo, kernel_cache)
    with make_client(settings) as c:
        resp = deliver(c, SECRET, "push", push_payload("other/kernels", "main", sha))
        assert resp.status_code == 202, resp.text
        assert resp.json()["source_hash"] is None
        ran, _ = run_queued(settings)
        assert TASK_RUN_CONFIGS in ran
    sweep, runs = _runs(sqlite_url, resp.json()["sweep_id"])
    assert (sweep.kernel, sweep.kernel_name, sweep.kernel_version) == (f"commit:{sha}", "c-abi-splitkv-host", sha)
    assert len(runs) == 5 and {r.outcome for r in runs} == {"pass"}, [(r.outcome, r.detail) for r in runs]
    assert {(r.kernel, r.kernel_version) for r in runs} == {("c-abi-splitkv-host", sha)}
    assert (kernel_cache / "built" / sha / "tree" / "examples/c_abi/libsplitkv_host.so").is_file()


def test_a_commit_whose_build_fails_stores_every_config_error_with_the_log(sqlite_url, tmp_path, kernel_cache):
    repo = PluginRepo(tmp_path / "repo")
    sha = repo.commit("broken", files={"examples/c_abi/splitkv_host.cpp": "this is not C++;\n"})
    settings = _settings(sqlite_url, repo, kernel_cache)
    with make_client(settings) as c:
        resp = deliver(c, SECRET, "push", push_payload("other/kernels", "main", sha))
        assert resp.status_code == 202, resp.text
        run_queued(settings)
    sweep, runs = _runs(sqlite_url, resp.json()["sweep_id"])
    assert len(runs) == 5 and {r.outcome for r in runs} == {"error"}
    detail = runs[0].detail
    assert detail.startswith(f"build of commit {sha[:12]} failed: the build command exited with status 2; "
                             "the build's log ends: "), detail
    assert "splitkv_host.cpp" in detail


def test_a_malformed_attnsweep_toml_is_refused_naming_the_field_and_nothing_is_stored(sqlite_url, tmp_path, kernel_cache):
    repo = PluginRepo(tmp_path / "repo")
    sha = repo.commit("malformed", manifest='[kernel]\nplugin = "so:../../etc/lib.so"\n')
    settings = _settings(sqlite_url, repo, kernel_cache)
    with make_client(settings) as c:
        resp = deliver(c, SECRET, "push", push_payload("other/kernels", "main", sha))
        assert resp.status_code == 422, resp.text
        (problem,) = resp.json()["detail"]
        assert problem["field"] == "after"
        assert problem["rule"].startswith("attnsweep.toml: kernel.plugin: "), problem
    with session_scope(sqlite_url) as s:
        assert s.scalars(select(Sweep)).all() == []


def test_a_bisection_steps_around_a_commit_that_does_not_build(tmp_path, kernel_cache):
    repo = PluginRepo(tmp_path / "repo")
    shas = [repo.commit("0"), repo.commit("1"),
            repo.commit("2 does not build", files={"examples/c_abi/splitkv_host.cpp": "this is not C++;\n"}),
            repo.commit("3"), repo.commit("4 causal off by one", core=causal_off_by_one),
            repo.commit("5", core=causal_off_by_one)]
    result = bisect(str(repo.path), shas[0], shas[-1], [CAUSAL], "cpu", cache_dir=tmp_path / "repos")
    assert result.first_bad == shas[4]
    assert result.skipped == [shas[2]] and (shas[2], "skip") in result.tested
    assert (kernel_cache / "built" / shas[2] / "failed").is_file()


# Six small configs (seed 1), five of them causal (tests/unit/ci/test_ci_bisect.py's request).
CAUSAL_SPEC = {"dtypes": ["f16", "f32"], "ranges": {"g": [1, 2], "seq_len_q": [1, 8], "seq_len_k": [1, 200],
                                                    "num_heads_q": [1, 4], "num_heads_kv": [1, 4], "head_dim_qk": [8, 32],
                                                    "head_dim_v": [8, 32], "split_kv": [1, 8]}}


def test_a_push_over_a_commit_that_does_not_build_is_triaged_and_bisected_to_its_first_bad_commit(
        sqlite_url, tmp_path, kernel_cache):
    from workers.app import TASK_BISECT, TASK_TRIAGE
    from workers.bisect import run_bisection

    repo = PluginRepo(tmp_path / "repo")
    shas = [repo.commit("0"), repo.commit("1"),
            repo.commit("2 does not build", files={"examples/c_abi/splitkv_host.cpp": "this is not C++;\n"}),
            repo.commit("3"), repo.commit("4 causal off by one", core=causal_off_by_one),
            repo.commit("5", core=causal_off_by_one)]
    upgrade(sqlite_url)
    settings = make_settings(sqlite_url, webhook_secret=SECRET, kernel_repo=str(repo.path), ci_samples=6,
                             ci_backend="cpu", ci_seed=1, ci_spec=CAUSAL_SPEC, triage_shrink_runs=10,
                             triage_shrink_seconds=20.0, kernel_cache=kernel_cache,
                             kernel_repo_cache=tmp_path / "repos")
    payload = push_payload("other/kernels", "main", shas[-1])
    payload["before"] = shas[0]
    with make_client(settings) as c:
        resp = deliver(c, SECRET, "push", payload)
        assert resp.status_code == 202, resp.text
        ran, held = run_queued(settings, hold=(TASK_BISECT,))
        assert TASK_TRIAGE in ran and [t["headers"]["task"] for t in held] == [TASK_BISECT]
        sweep_id = resp.json()["sweep_id"]
        (cluster, *_) = c.get(f"/sweeps/{sweep_id}/clusters").json()["clusters"]
        # Shrunk on the built plug-in: its reproducer names the commit's tree, not the project's kernels.
        assert cluster["minimal_config"] is not None and f"tree:{shas[-1]}:" in cluster["reproducer"], cluster
        assert run_bisection(sqlite_url, held[0]["args"][0], settings) == "done"
        done = c.get(f"/ci/{shas[-1]}").json()
        bisection = c.get(done["bisections"][0]["url"]).json()
    assert done["first_bad_commits"] == [shas[4]], done
    assert bisection["skipped"] == [shas[2]] and bisection["first_bad"] == shas[4], bisection
