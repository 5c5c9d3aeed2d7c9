"""The verdict rules: pass/fail for pushes, new versus known failures for pull requests; the
bisections of a push in words."""
from __future__ import annotations

from ci.verdict import bisections_text, judge


def test_unfinished_and_broken_sweeps_have_no_kernel_verdict():
    assert judge("queued", "push", ["a"], None).verdict == "pending"
    assert judge("running", "pull_request", ["a"], {"a"}).verdict == "pending"
    assert judge("failed", "push", [], None).verdict == "error"
    assert judge("cancelled", "pull_request", [], set()).verdict == "error"


def test_a_push_fails_on_any_failure():
    assert judge("done", "push", [], None).verdict == "pass"
    j = judge("done", "push", ["a", "b"], {"a"})  # a push has no base: every failure counts
    assert (j.verdict, j.new, j.known) == ("fail", ("a", "b"), ())


def test_a_pull_request_fails_only_on_failures_its_base_did_not_have():
    j = judge("done", "pull_request", ["a", "b"], {"a", "b", "c"})
    assert (j.verdict, j.new, j.known) == ("pass", (), ("a", "b"))
    j = judge("done", "pull_request", ["a", "d"], {"a", "c"})
    assert (j.verdict, j.new, j.known) == ("fail", ("d",), ("a",))


def test_without_a_finished_base_every_failure_of_a_pull_request_is_new():
    j = judge("done", "pull_request", ["a"], None)
    assert (j.verdict, j.new, j.known) == ("fail", ("a",), ())


def test_failures_are_counted_by_bug_once_clustered_else_by_config():
    from ci.verdict import failures_text

    push = judge("done", "push", ["a", "b", "c"], None)
    assert failures_text(push, 3, None, compared=False) == "3 failing"
    assert failures_text(push, 3, [{"a", "b"}, {"c"}], compared=False) == "2 bugs in 3 failing configs"
    assert failures_text(push, 1, [{"a"}], compared=False) == "1 bug in 1 failing config"
    pr = judge("done", "pull_request", ["a", "b", "c", "d"], {"a", "b"})
    assert failures_text(pr, 4, None, compared=True) == "4 failing (2 new, 2 known on the base branch)"
    # A bug is new when any of its configs is a new failure; {a, b} is known on the base branch.
    assert failures_text(pr, 4, [{"a", "b"}, {"c"}, {"d", "a"}], compared=True) == \
        "2 new bugs in 4 failing configs (1 bug known on the base branch)"


def test_commit_status_and_junit_report_stored_bugs(sqlite_url):
    import xml.etree.ElementTree as ET

    from sqlalchemy import select

    from ci.junit import render
    from ci.notify import describe
    from ci.status import commit_status, junit_bugs
    from store import clusters as stored
    from store.db import session_scope
    from store.migrate import upgrade
    from store.models import ConfigRun, Sweep
    from tests.e2e import seed
    from triage.sweep import triage_sweep

    upgrade(sqlite_url)
    nightly = seed.seed_finished(sqlite_url)
    failing = len(nightly.failures())
    with session_scope(sqlite_url) as s:
        sweep = s.get(Sweep, nightly.sweep_id)
        sweep.event = "push"
        before = commit_status(s, sweep, with_failures=False)
        assert before["triage"] == "pending" and before["bugs"] is None
        assert describe(before) == f"{before['configs_done']} configs: {failing} failing"
        found = [c.to_dict() for c in triage_sweep(s, sweep.id, shrink_configs=False, classify_configs=False)]
        stored.store_clusters(s, sweep.id, found)
    with session_scope(sqlite_url) as s:
        sweep = s.get(Sweep, nightly.sweep_id)
        after = commit_status(s, sweep, with_failures=False)
        assert (after["triage"], after["bugs"], after["new_bugs"]) == ("done", 1, 1)
        assert describe(after) == f"{after['configs_done']} configs: 1 bug in {failing} failing configs"
        runs = s.scalars(select(ConfigRun).where(ConfigRun.sweep_id == sweep.id).order_by(ConfigRun.seq)).all()
        bugs, summary = junit_bugs(s, sweep)
        doc = ET.fromstring(render(sweep, runs, bugs=bugs, summary=summary))
    props = {p.get("name"): p.get("value") for p in doc.iter("property")}
    assert props["attnsweep.summary"] == f"1 bug in {failing} failing configs"
    assert props["attnsweep.bug.1"].startswith(f"fail/rms/rowwise, {failing} failing configs: dtype=bf16 and split_kv>=16")
    messages = [e.get("message") for e in doc.iter() if e.tag in ("failure", "error")]
    assert len(messages) == failing and all(m.startswith("bug 1 of 1 (dtype=bf16 and split_kv>=16): ") for m in messages)


def test_bisections_name_each_distinct_first_bad_commit_and_whether_any_still_runs():
    a, b = "a" * 40, "b" * 40
    assert bisections_text([("done", a, ())]) == f"first bad commit {a[:12]}"
    assert bisections_text([("running", None, ())]) == "bisecting"
    assert bisections_text([("error", None, ())]) == "bisection failed"
    # Two bugs of one commit: named once.
    assert bisections_text([("done", a, ()), ("done", a, ())]) == f"first bad commit {a[:12]}"
    assert bisections_text([("done", a, ()), ("done", b, ())]) == f"first bad commits {a[:12]}, {b[:12]}"
    assert bisections_text([("done", a, ()), ("queued", None, ())]) == f"first bad commit {a[:12]}; bisecting"
    assert bisections_text([("queued", None, ()), ("running", None, ())]) == "bisecting"
    assert (bisections_text([("done", a, ()), ("done", None, ("c" * 40, "d" * 40)), ("error", None, ())])
            == f"first bad commit {a[:12]}; 1 ambiguous (untestable commits); 1 of 3 bisections failed")
