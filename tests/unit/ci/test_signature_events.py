"""Webhook signatures and the push / pull_request payloads a sweep is started from."""
from __future__ import annotations

import hashlib
import hmac

import pytest

from ci.events import CiEvent, EventError, Ignored, parse_event
from ci.signature import sign, signature_problem
from tests.unit.ci.hooks import pr_payload, push_payload

SHA = "a" * 40


def test_signature_is_githubs_hmac_sha256_of_the_raw_body():
    body = b'{"ref": "refs/heads/main"}'
    expected = "sha256=" + hmac.new(b"k3y", body, hashlib.sha256).hexdigest()
    assert sign("k3y", body) == expected
    assert signature_problem("k3y", body, expected) is None
    assert signature_problem("k3y", body, None).startswith("X-Hub-Signature-256 is missing")
    assert "does not match" in signature_problem("k3y", body + b" ", expected)
    assert "does not match" in signature_problem("other", body, expected)
    assert "does not match" in signature_problem("k3y", body, expected.replace("sha256=", "sha1="))


def test_push_and_pull_request_name_repository_ref_and_commit():
    assert parse_event("push", push_payload("o/r", "main", SHA)) == CiEvent("push", "o/r", "refs/heads/main", SHA)
    # `before` is where the push's commits start (a new branch's all-zero one is none).
    onto = parse_event("push", {**push_payload("o/r", "main", SHA), "before": "c" * 40})
    assert onto == CiEvent("push", "o/r", "refs/heads/main", SHA, before="c" * 40)
    pr = parse_event("pull_request", pr_payload("o/r", 12, "fix/x", SHA, "main", "b" * 40, action="opened"))
    assert pr == CiEvent("pull_request", "o/r", "refs/heads/fix/x", SHA, base_ref="refs/heads/main", pr_number=12)


@pytest.mark.parametrize("name,payload,why", [
    ("issues", {"action": "opened"}, "not swept"),
    ("push", {**push_payload("o/r", "main", SHA), "deleted": True}, "deletes a branch"),
    ("push", push_payload("o/r", "main", "0" * 40), "deletes a branch"),
    ("push", {**push_payload("o/r", "main", SHA), "ref": "refs/tags/v1.0"}, "only branch pushes"),
    ("pull_request", pr_payload("o/r", 1, "f", SHA, "main", SHA, action="closed"), "'closed'"),
    ("pull_request", pr_payload("o/r", 1, "f", SHA, "main", SHA, action="labeled"), "'labeled'"),
])
def test_other_events_and_actions_are_ignored(name, payload, why):
    result = parse_event(name, payload)
    assert isinstance(result, Ignored) and why in result.reason


@pytest.mark.parametrize("name,payload,field", [
    ("push", {"ref": "refs/heads/main", "repository": {"full_name": "o/r"}}, "after"),
    ("push", {**push_payload("o/r", "main", SHA), "after": "A" * 40}, "after"),
    ("push", {**push_payload("o/r", "main", SHA), "before": "main"}, "before"),
    ("push", {**push_payload("o/r", "main", SHA), "repository": {}}, "repository.full_name"),
    ("pull_request", pr_payload("o/r", 1, "f", "123", "main", SHA), "pull_request.head.sha"),
    ("pull_request", {**pr_payload("o/r", 1, "f", SHA, "main", SHA), "number": 0}, "number"),
    ("push", ["not", "an", "object"], "body"),
])
def test_a_payload_without_what_a_sweep_needs_names_the_field(name, payload, field):
    with pytest.raises(EventError) as err:
        parse_event(name, payload)
    assert field in [f for f, _ in err.value.problems]
