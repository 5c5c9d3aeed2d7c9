"""Test helpers: a kernel repository in a temporary folder, and signed GitHub-style deliveries."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from ci.signature import sign

ROOT = Path(__file__).resolve().parents[3]
DEFECT_LINE = "#define ATTN_DEFECT_{} 1  // the defect switch, turned on in the source\n"


class KernelRepo:
    """A git repository holding kernels/ copied from this checkout; commit() edits and commits."""

    def __init__(self, path: Path, full: bool = False):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main")
        src = ROOT / "kernels"
        if full:
            shutil.copytree(src, path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copytree(src / "src", path / "kernels" / "src")

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=ci test", "-c", "user.email=ci@test", *args], cwd=self.path,
                              check=True, capture_output=True, text=True).stdout.strip()

    @property
    def entry(self) -> Path:
        return self.path / "kernels" / "src" / "attention.hip"

    def commit(self, message: str, edit: Callable[[str], str] | None = None, branch: str | None = None) -> str:
        if branch is not None:
            self.git("checkout", "--quiet", "-B", branch)
        if edit is not None:
            self.entry.write_text(edit(self.entry.read_text()))
        self.git("add", "-A")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def show(self, sha: str, path: str) -> str:
        return self.git("show", f"{sha}:{path}") + "\n"


def with_defects(*names: str) -> Callable[[str], str]:
    """An edit that turns defect switches on: #define lines after the file's header comment."""

    def edit(text: str) -> str:
        head, sep, rest = text.partition('#include "hip_compat.h"')
        return head + "".join(DEFECT_LINE.format(n.upper()) for n in names) + sep + rest

    return edit


# Hand-made changes to the kernels' arithmetic that no defect switch describes: the cpu backend's
# numpy model cannot see them, the hostemu backend (the source itself on the CPU) must.
HAND_EDITS = {
    # The grouped kernel's last key: `last_key + 1` -> `last_key`, so the newest key of every
    # batch entry (L_b, docs/spec.md §3) is never attended on the grouped path (f16/bf16/f32, dims <= 256).
    "grouped_last_key": ("    const int key_end = min(range.blk_end * BLOCK_N, range.last_key + 1);\n",
                         "    const int key_end = min(range.blk_end * BLOCK_N, range.last_key);   // hand-made bug\n"),
}


def hand_edit(name: str) -> Callable[[str], str]:
    """An edit making HAND_EDITS[name]'s change at its first place (the grouped kernel's)."""
    old, new = HAND_EDITS[name]

    def edit(text: str) -> str:
        if old not in text:
            raise ValueError(f"hand edit {name}: the line it changes is not in the source: {old.strip()}")
        return text.replace(old, new, 1)

    return edit


def without_defects(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#define ATTN_DEFECT_"))


def push_payload(repository: str, branch: str, sha: str) -> dict[str, Any]:
    return {"ref": f"refs/heads/{branch}", "before": "0" * 40, "after": sha, "deleted": False,
            "repository": {"full_name": repository, "clone_url": f"https://example.invalid/{repository}.git"}}


def repo_payload(full_name: str) -> dict[str, Any]:
    """A repository as GitHub's events describe one (the fields ci.events reads)."""
    url = f"https://example.invalid/{full_name}"
    return {"full_name": full_name, "clone_url": f"{url}.git", "html_url": url,
            "ssh_url": f"git@example.invalid:{full_name}.git", "git_url": f"git://example.invalid/{full_name}.git"}


def pr_payload(repository: str, number: int, head_branch: str, head_sha: str, base_branch: str, base_sha: str,
               action: str = "synchronize", head_repository: str | None = None) -> dict[str, Any]:
    """A pull_request event; `head_repository`: the fork it comes from (None: a branch of `repository`)."""
    head = repo_payload(head_repository or repository)
    return {"action": action, "number": number, "repository": repo_payload(repository),
            "pull_request": {"number": number, "head": {"ref": head_branch, "sha": head_sha, "repo": head},
                             "base": {"ref": base_branch, "sha": base_sha, "repo": repo_payload(repository)}}}


def deliver(client: Any, secret: str | None, event: str, payload: Any, delivery: str | None = None,
            signature: str | None = None) -> Any:
    """POST /webhooks/ci the way GitHub does: raw JSON body, HMAC header, event and delivery headers."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"content-type": "application/json", "X-GitHub-Event": event,
               "X-GitHub-Delivery": delivery if delivery is not None else str(uuid.uuid4())}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    elif secret is not None:
        headers["X-Hub-Signature-256"] = sign(secret, body)
    return client.post("/webhooks/ci", content=body, headers=headers)


class Forge:
    """Records every request; answers 201 as GitHub does."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        forge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                forge.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
