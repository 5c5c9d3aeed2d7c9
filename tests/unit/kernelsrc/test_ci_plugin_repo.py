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
