"""Hiding secrets in text that may be shown: an error stored for a client, a log line, an answer.

Two kinds of secret reach text: credentials inside URLs (https://user:token@host/..., as git and
database drivers echo them in their errors) and the values of the deployment's own secrets
(tokens, the webhook key) wherever some message quotes them. Every error, log line and answer
that can carry either goes through `scrub_text` (Settings.scrub binds the deployment's secrets).
"""
from __future__ import annotations

import logging
import re
from typing import Callable, Iterable

HIDDEN = "***"
# scheme://userinfo@ : the user info of any URL, whatever its scheme (https, ssh, postgresql ...).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@'\"<>]+)@")
# Secrets shorter than this are not searched for in text (a 2-character password would hide
# every occurrence of those letters); settings.MIN_TOKEN_CHARS keeps API tokens far above it.
MIN_SECRET_CHARS = 6


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every URL's user info replaced by *** and every secret of `secrets` by ***."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{HIDDEN}@", text)
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text


def strip_userinfo(url: str) -> str:
    """A URL without its user info (as scrub_text shows it); anything else unchanged."""
    return scrub_text(url)


_scrub_logs: Callable[[str], str] | None = None


def _scrub_arg(arg: object, scrub: Callable[[str], str]) -> object:
    # Numbers stay numbers (a "%d" needs one); anything whose text shows a secret becomes that text scrubbed.
    if arg is None or isinstance(arg, (bool, int, float)):
        return arg
    text = arg if isinstance(arg, str) else str(arg)
    clean = scrub(text)
    return clean if clean != text or isinstance(arg, str) else arg


def _scrub_record(record: logging.LogRecord) -> None:
    """The record's message, each argument (formatters such as uvicorn's read them one by one)
    and its exception text, scrubbed."""
    scrub = _scrub_logs
    if scrub is None:
        return
    if isinstance(record.args, tuple):
        record.args = tuple(_scrub_arg(a, scrub) for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: _scrub_arg(v, scrub) for k, v in record.args.items()}
    try:
        message = record.getMessage()
    except (TypeError, ValueError):   # a record that never formatted: leave it to the handler's error
        message = None
    if message is not None and scrub(message) != message:
        # The template itself shows one, or a URL spans the template and an argument: the whole
        # message, formatted and scrubbed, replaces both.
        record.msg, record.args = scrub(message), None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = scrub(record.exc_text)


def install_log_scrubbing(scrub: Callable[[str], str]) -> None:
    """Scrub every log record this process makes from now on, whichever logger and handler it
    goes to (ours, uvicorn's, Celery's): the record factory scrubs its message, with its
    arguments, and its exception text. A later call replaces the scrubbing function."""
    global _scrub_logs
    _scrub_logs = scrub
    inner = logging.getLogRecordFactory()
    if getattr(inner, "_attnsweep_scrubs", False):
        return

    def factory(*args, **kwargs) -> logging.LogRecord:  # noqa: ANN002, ANN003
        record = inner(*args, **kwargs)
        _scrub_record(record)
        return record

    factory._attnsweep_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
