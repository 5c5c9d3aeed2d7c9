"""Commit statuses: a CI sweep's state posted to the forge when the sweep starts and when it ends.

Off unless ATTNSWEEP_STATUS_TOKEN is set. The request is GitHub's statuses API
(`POST {ATTNSWEEP_STATUS_API}/repos/{owner}/{name}/statuses/{sha}` with `state`, `description`,
`target_url`, `context`), which Gitea and Forgejo accept too. A status is a courtesy to the pull
request, not part of the sweep: a forge that is down or refuses the token is logged and never
fails the webhook or the worker that finished the sweep.
"""
from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from store.db import Session

from ci.status import commit_status
from settings import Settings
from store.models import Sweep

log = logging.getLogger(__name__)

# The verdict (ci/verdict.py) as a commit status state.
STATES = {"pending": "pending", "pass": "success", "fail": "failure", "error": "error"}
TIMEOUT_S = 5.0
MAX_DESCRIPTION = 140  # GitHub refuses longer descriptions
_FULL_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# owner/name at the end of a repository URL: https://host/owner/name(.git), git@host:owner/name(.git).
_URL_PATH = re.compile(r"^(?:[a-z+]+://[^/]+/|[\w.-]+@[\w.-]+:)(?P<owner>[A-Za-z0-9_.-]+)/(?P<name>[A-Za-z0-9_.-]+?)"
                       r"(?:\.git)?/?$")


def describe(status: dict[str, Any]) -> str:
    done, total, failures = status["configs_done"], status["configs"], status["failures"]
    if status["verdict"] == "pending":
        text = f"sweep {status['sweep_id']}: {done}/{total} configs run" + (f", {failures} failing so far" if failures else "")
    elif status["verdict"] == "error":
        text = f"sweep {status['sweep_id']} {status['state']}: {status.get('error') or 'no reason stored'}"
    else:
        # ci.verdict.failures_text: by bug once the sweep's triage is stored, else by config.
        text = f"{done} configs: {status['summary']}"
    return text[:MAX_DESCRIPTION]


def status_body(settings: Settings, session: Session, sweep: Sweep) -> dict[str, Any]:
    status = commit_status(session, sweep, with_failures=False)
    body: dict[str, Any] = {"state": STATES[status["verdict"]], "description": describe(status),
                            "context": settings.status_context}
    if settings.public_url:
        body["target_url"] = f"{settings.public_url.rstrip('/')}/dashboard/sweeps/{sweep.id}"
    return body


def deployment_repository(settings: Settings) -> str | None:
    """owner/name of the repository this deployment sweeps: ATTNSWEEP_STATUS_REPOSITORY, else the
    path of ATTNSWEEP_KERNEL_REPO's URL (https://host/owner/name.git, git@host:owner/name.git);
    None where neither names one (a local kernel repository)."""
    if settings.status_repository:
        return settings.status_repository
    match = _URL_PATH.match(settings.kernel_repo.strip())
    return f"{match.group('owner')}/{match.group('name')}" if match else None


def status_url(settings: Settings, repository: str, sha: str) -> str:
    """Where a commit's status goes: the deployment's repository where it names one, else the
    event's `repository`, which ci.events has checked is a plain owner/name."""
    target = deployment_repository(settings) or repository
    if not _FULL_NAME.match(target) or any(p in (".", "..") for p in target.split("/")):
        raise ValueError(f"{target!r} is not owner/name")
    return f"{settings.status_api.rstrip('/')}/repos/{quote(target, safe='/')}/statuses/{quote(sha, safe='')}"


def _post(settings: Settings, url: str, body: dict[str, Any], what: str) -> bool:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {settings.status_token}", "Accept": "application/vnd.github+json",
        "Content-Type": "application/json", "User-Agent": "attnsweep"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError) as exc:
        log.warning("commit status of %s (%s) not posted: %s", what, body["state"], exc)
        return False


def post_status(settings: Settings, session: Session, sweep_id: int) -> bool:
    """Post the CI sweep's status; False when off, not a CI sweep, or the forge did not take it."""
    if not settings.status_token:
        return False
    sweep = session.get(Sweep, sweep_id)
    if sweep is None or not sweep.repository or not sweep.commit_sha:
        return False
    body = status_body(settings, session, sweep)
    return _post(settings, status_url(settings, sweep.repository, sweep.commit_sha), body, f"sweep {sweep_id}")


def post_not_swept(settings: Settings, repository: str, sha: str, reason: str) -> bool:
    """Post `error` with `reason` for a commit that is not swept (a fork's pull request not trusted)."""
    if not settings.status_token:
        return False
    body = {"state": "error", "description": reason[:MAX_DESCRIPTION], "context": settings.status_context}
    return _post(settings, status_url(settings, repository, sha), body, f"commit {sha[:12]}")


def sweep_ended(sweep_id: int, url: str | None = None, *, session: Session | None = None) -> None:
    """Called by whoever moved the sweep to done, after that commit: the final status. `session`:
    the caller's unit of work, where it has one (then `url` is not opened)."""
    from settings import get_settings
    from store.db import session_scope

    settings = get_settings()
    if not settings.status_token:
        return
    try:
        if session is not None:
            post_status(settings, session, sweep_id)
            session.commit()
            return
        with session_scope(url or settings.database_url) as s:
            post_status(settings, s, sweep_id)
    except Exception:  # noqa: BLE001 - see the module docstring: never fails the worker
        if session is not None:
            session.rollback()
        log.exception("commit status of sweep %s not posted", sweep_id)
