"""X-Hub-Signature-256: HMAC-SHA256 of the raw request body under the shared webhook secret."""
from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Hub-Signature-256"
PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    """The header value a sender computes (GitHub's format: sha256=<hex digest>)."""
    return PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_problem(secret: str, body: bytes, header: str | None) -> str | None:
    """None when `header` signs `body` under `secret`, else the broken rule.

    The comparison is constant-time over the whole header value, so a forger learns nothing
    from how long a wrong guess took."""
    if not header:
        return f"{HEADER} is missing: deliveries must be signed with ATTNSWEEP_WEBHOOK_SECRET"
    if not hmac.compare_digest(header.strip().encode(), sign(secret, body).encode()):
        return f"{HEADER} does not match the body signed with ATTNSWEEP_WEBHOOK_SECRET (HMAC-SHA256, {PREFIX}<hex>)"
    return None
