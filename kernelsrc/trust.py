"""Which repositories' source may be fetched and built: only those the operator named.

A repository is trusted when it is ATTNSWEEP_KERNEL_REPO or one of ATTNSWEEP_KERNEL_REPOSITORIES,
compared exactly (URLs as strings, trailing slashes dropped; local paths normalised, never
resolved through links). Everything else is refused before any connection is made: a request
cannot make a worker reach a host or read a folder the operator did not name. A request never
carries credentials either: a URL with user info (https://user:token@host/...) is refused, and
the operator's credentials come from the settings' URLs or git's credential helper.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

from settings import Settings


def _key(repo: str) -> str:
    repo = repo.strip().rstrip("/")
    if "://" in repo or "@" in repo.split("/", 1)[0]:
        return repo
    return os.path.normpath(repo)


def has_userinfo(repo: str) -> bool:
    """Whether `repo` is a URL (scheme://) that carries user info (a user, a password or a token)."""
    if "://" not in repo:
        return False
    try:
        return "@" in urlsplit(repo).netloc
    except ValueError:
        return True


def repository_problem(repo: str, settings: Settings) -> str | None:
    """Why `repo` may not be fetched from a request (the rule, naming the setting), or None."""
    if has_userinfo(repo):
        return ("repo must not carry credentials (user info in the URL): the deployment's own credentials "
                "come from its settings or git's credential helper")
    trusted = {_key(r) for r in settings.trusted_repositories}
    if _key(repo) not in trusted:
        return ("repo is not a repository this deployment trusts: only ATTNSWEEP_KERNEL_REPO and the exact URLs "
                "or paths of ATTNSWEEP_KERNEL_REPOSITORIES are fetched")
    return None


def is_trusted(url: str, settings: Settings) -> bool:
    """Whether a repository named by an event (a fork's clone URL) is one of the trusted ones."""
    return _key(url) in {_key(r) for r in settings.trusted_repositories}
