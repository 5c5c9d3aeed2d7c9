"""Free loopback ports, bounded waits, and JSON over HTTP to 127.0.0.1 (standard library only)."""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2,
             ignore: tuple[type[BaseException], ...] = ()) -> Any:
    """predicate()'s first truthy value, polled every `interval` s; TimeoutError naming `what`
    after `timeout` s. Exceptions of the `ignore` types count as not yet (a dependency still down)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def http_json(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
              timeout: float = 30, raw_body: bytes | None = None, parse: bool = True) -> tuple[int, Any]:
    """(status, body): with `parse`, the body parsed as JSON when it is an object or array; else the bytes.
    An HTTP error status is returned, not raised; only loopback addresses are asked."""
    if not url.startswith(("http://127.0.0.1:", "http://localhost:", "http://[::1]:")):
        raise ValueError(f"only loopback addresses are asked: {url}")
    data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={**({"content-type": "application/json"} if data else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    if parse and raw[:1] in (b"{", b"["):
        try:
            return status, json.loads(raw)
        except ValueError:
            pass
    return status, raw
