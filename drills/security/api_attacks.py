"""Attacks on the API: what a request may make the service fetch, reach, show, or change."""
from __future__ import annotations

import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from drills.security.stack import REPOSITORY, SecurityStack
from harness import Proc, ServiceStack, free_port

CONFIG = dict(dtype="f16", g=1, seq_len_q=1, seq_len_k=32, num_heads_q=1, num_heads_kv=1, head_dim_qk=16, head_dim_v=16)
CHROMIUM = "/usr/bin/chromium"


@dataclass
class Row:
    attack: str
    answer: str
    contained: bool
    outcome: str = "-"


class Listener:
    """A TCP port standing for an internal service: counts the connections it is sent."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self) -> int:
        self._stop = True
        self.thread.join()
        self.sock.close()
        return self.connections


def _bisect(s: SecurityStack, repo: str) -> tuple[int, dict]:
    return s.request("POST", "/bisect", {"repo": repo, "good": "a" * 40, "bad": "b" * 40, "configs": [CONFIG],
                                          "backend": "hostemu"}, token="submit")


def _rule(answer: object) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("detail"), list):
        return answer["detail"][0]["rule"][:60]
    if isinstance(answer, dict):
        return str(answer.get("detail") or answer.get("status"))[:60]
    return str(answer)[:60]


def attacker_repository(s: SecurityStack) -> Row:
    """An attacker's repository with code in it: named by path, as a file URL, over HTTP."""
    evil = s.base / "attacker-repo"
    evil.mkdir()
    subprocess.run(["git", "init", "--quiet", str(evil)], check=True)
    answers = [_bisect(s, repo) for repo in (str(evil), f"file://{evil}", "http://attacker.example/x.git")]
    ok = all(code == 422 for code, _ in answers)
    return Row("POST /bisect: an attacker's repository (path, file://, http://)", f"{answers[0][0]} {_rule(answers[0][1])}",
               ok, "nothing stored" if not s.db("SELECT 1 FROM bisections") else "stored")


def port_scan(s: SecurityStack) -> Row:
    listener = Listener()
    open_port = _bisect(s, f"http://127.0.0.1:{listener.port}/x.git")
    closed_port = _bisect(s, f"http://127.0.0.1:{free_port()}/x.git")
    reached = listener.close()
    same = open_port == closed_port
    return Row("POST /bisect: an internal address (port scan)", f"{open_port[0]} both, same answer: {same}",
               open_port[0] == 422 and reached == 0 and same, f"{reached} connections made")


def credentials_in_url(s: SecurityStack) -> Row:
    password = "pw-" + uuid.uuid4().hex
    code, answer = _bisect(s, f"https://bot:{password}@git.example/k.git")
    return Row("POST /bisect: a password in the repository URL", f"{code} {_rule(answer)}",
               code == 422 and password not in str(answer))


def no_token(s: SecurityStack) -> Row:
    code, answer = s.request("POST", "/sweeps", {"samples": 2, "backend": "cpu"}, token=None)
    wrong, _ = s.request("POST", "/sweeps", {"samples": 2, "backend": "cpu"}, token=None,
                         headers={"authorization": "Bearer " + "x" * 43})
    return Row("POST /sweeps without a token, with a wrong one", f"{code}, {wrong}", code == 401 and wrong == 403)


def weak_token(s: SecurityStack) -> Row:
    stack = ServiceStack(s.env(ATTNSWEEP_API_TOKENS="x:submit:x"), s.base / "weak")
    stack.logs.mkdir(exist_ok=True)
    api = Proc("api-weak", stack.cli("serve", "--port", str(free_port())), stack.env, stack.logs / "api.log").start()
    try:
        api.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        api.stop()
    said = api.log()
    refused = api.proc.returncode not in (None, 0) and "api_tokens" in said and "at least 32" in said
    return Row("a one-letter token (x:submit:x)", "the API does not start" if refused else "started", refused,
               f"exit {api.proc.returncode}")


def deep_json(s: SecurityStack) -> Row:
    body = b"[" * 100_000 + b"]" * 100_000
    code, answer = s.request("POST", "/webhooks/ci", token=None, raw_body=body,
                             headers={"content-type": "application/json", "X-GitHub-Event": "push"})
    return Row("webhook: 100,000 nested brackets", f"{code} {_rule(answer)}", code == 422)


def status_traversal(s: SecurityStack) -> Row:
    before = len(s.forge.requests)
    code, answer = s.deliver("push", {"ref": "refs/heads/main", "after": "c" * 40,
                                      "repository": {"full_name": "../../../orgs/victim/x"}}, uuid.uuid4().hex)
    other, reply = s.deliver("push", {"ref": "refs/heads/main", "after": "c" * 40,
                                      "repository": {"full_name": "victim/x"}}, uuid.uuid4().hex)
    posted = s.forge.requests[before:]
    return Row("webhook: full_name ../../../orgs/victim/x; another repository", f"{code}; {other} {_rule(reply)}",
               code == 422 and other == 200 and not posted, f"{len(posted)} statuses posted")


def untrusted_fork(s: SecurityStack) -> Row:
    before = len(s.forge.requests)
    sha = s.repo.commit("a fork's change", "\n// from a fork\n")
    fork = {"full_name": "mallory/kernels", "clone_url": "https://example.invalid/mallory/kernels.git"}
    code, answer = s.deliver("pull_request", {
        "action": "opened", "number": 9, "repository": {"full_name": REPOSITORY},
        "pull_request": {"number": 9, "head": {"ref": "x", "sha": sha, "repo": fork},
                         "base": {"ref": "main", "sha": sha, "repo": {"full_name": REPOSITORY}}}}, uuid.uuid4().hex)
    posted = s.forge.requests[before:]
    said = [(r["path"], r["body"].get("description")) for r in posted]
    ok = code == 200 and said == [(f"/repos/{REPOSITORY}/statuses/{sha}", "not swept: head repository not trusted")]
    swept = s.db("SELECT count(*) FROM sweeps WHERE commit_sha = %s", sha)[0][0]
    return Row("pull request from an untrusted fork", f"{code} {_rule(answer)}", ok and swept == 0,
               f"status: {said[0][1] if said else 'none'}")


def echoed_repository_password(s: SecurityStack) -> Row:
    password = "repo-pw-" + uuid.uuid4().hex
    stack = ServiceStack(s.env(ATTNSWEEP_KERNEL_REPO=f"https://bot:{password}@127.0.0.1:{free_port()}/k.git"),
                         s.base / "echo")
    stack.logs.mkdir(exist_ok=True)
    stack.start_api()
    try:
        saved, s.stack = s.stack, stack
        code, answer = s.push("d" * 40, uuid.uuid4().hex)
    finally:
        s.stack = saved
        stack.stop()
    logged = stack.logs.joinpath("api.log").read_text(errors="replace")
    return Row("webhook 503: ATTNSWEEP_KERNEL_REPO with a password", f"{code} {_rule(answer)}",
               code == 503 and password not in str(answer) and password not in logged)


def headers(s: SecurityStack) -> Row:
    import urllib.request

    with urllib.request.urlopen(s.stack.url("/dashboard")) as resp:
        csp, nosniff, frame = (resp.headers.get(h, "") for h in ("content-security-policy", "x-content-type-options",
                                                                  "x-frame-options"))
        page = resp.read().decode()
    ok = "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and nosniff == "nosniff" and frame == "DENY"
    return Row("the dashboard: CSP, nosniff, framing", "CSP without inline script" if ok else csp[:60],
               ok and "<script>" not in page)


def cross_site(s: SecurityStack) -> Row:
    """A page of another origin posts a form to cancel a sweep, and a JSON fetch, to an API whose
    writes are open (ATTNSWEEP_AUTH=off: the laptop case), in Chromium."""
    if not Path(CHROMIUM).exists():
        return Row("cross-site form and fetch (Chromium)", f"not run: no {CHROMIUM}", False)
    open_api = ServiceStack(s.env(ATTNSWEEP_AUTH="off"), s.base / "open")
    open_api.logs.mkdir(exist_ok=True)
    open_api.start_api()
    try:
        code, queued = open_api.request("POST", "/sweeps", {"samples": 2, "backend": "cuda", "label": "victim"})
        sid = queued["id"]
        target = open_api.url(f"/sweeps/{sid}")
        page = f"""<!doctype html><body>
<form id="cancel" method="POST" action="{target}/cancel" enctype="text/plain"><input name='{{"x":"' value='"}}'></form>
<form id="rerun" method="POST" action="{target}/rerun" target="frame"><input name="failures_only" value="false"></form>
<iframe name="frame"></iframe>
<script>
fetch("{target}/cancel", {{method: "POST", headers: {{"content-type": "application/json"}}, body: "{{}}"}})
  .then(() => document.title = "fetch sent", e => document.title = "fetch blocked");
document.getElementById("rerun").submit();
setTimeout(() => document.getElementById("cancel").submit(), 500);
</script></body>"""

        class Evil(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.end_headers()
                self.wfile.write(page.encode())

            def log_message(self, *args: object) -> None:
                pass

        evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
        threading.Thread(target=evil.serve_forever, daemon=True).start()
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            tab = browser.new_page()
            tab.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
            tab.wait_for_timeout(3000)
            title = tab.title()
            browser.close()
        evil.shutdown()
        status = s.db("SELECT status FROM sweeps WHERE id = %s", sid)[0][0]
        reruns = s.db("SELECT count(*) FROM sweeps WHERE rerun_of = %s", sid)[0][0]
    finally:
        open_api.stop()
    ok = status == "queued" and reruns == 0
    return Row("cross-site form and fetch (Chromium, writes open)", f"sweep {status}, {reruns} reruns; {title}", ok)


ATTACKS: list[Callable[[SecurityStack], Row]] = [
    attacker_repository, port_scan, credentials_in_url, no_token, weak_token, deep_json, status_traversal,
    untrusted_fork, echoed_repository_password, headers, cross_site]
