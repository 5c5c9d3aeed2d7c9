"""A kernel repository built in a temporary folder: COMMITS commits of kernels/src, the one at
DEFECT turning the causal_off_by_one switch on (every later one keeps it) and the one at BROKEN
not compiling. The `kernel_repo` fixture (tests/conftest.py) builds it once per test session;
bisections over it (tests/unit/triage, tests/unit/api, tests/unit/ci, tests/integration) must
find shas[DEFECT]."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kernels.source import SRC_DIR

COMMITS = 25
BROKEN = 12      # the first midpoint of 0..24: bisection meets it at once and must step around it
DEFECT = 17      # the first commit whose source defines ATTN_DEFECT_CAUSAL_OFF_BY_ONE
# A causal config the defect breaks and the clean source passes, small enough to run in milliseconds.
CONFIG = dict(dtype="f32", g=1, seq_len_q=4, seq_len_k=40, num_heads_q=1, num_heads_kv=1, head_dim_qk=8,
              head_dim_v=8, causal=True)


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


def build_kernel_repo(repo: Path) -> list[str]:
    """COMMITS commits of kernels/src in `repo` (an empty folder); their ids, oldest first."""
    _git(repo, "init", "--quiet", "-b", "main")
    src = repo / "kernels" / "src"
    shutil.copytree(SRC_DIR, src)
    entry = src / "attention.hip"
    pristine = entry.read_text()
    shas = []
    for i in range(COMMITS):
        text = pristine
        if i >= DEFECT:
            text = "#define ATTN_DEFECT_CAUSAL_OFF_BY_ONE\n" + text
        if i == BROKEN:
            text += "\nthis line is not C++;\n"
        entry.write_text(text + "".join(f"// revision {j}\n" for j in range(i + 1)))
        _git(repo, "add", "-A")
        _git(repo, "commit", "--quiet", "-m", f"revision {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas
