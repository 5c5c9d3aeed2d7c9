"""The verdict rules: pass/fail for pushes, new versus known failures for pull requests."""
from __future__ import annotations

from ci.verdict import judge


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
