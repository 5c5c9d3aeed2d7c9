"""Kernel repositories built in a temporary folder.

`build_kernel_repo`: COMMITS commits of kernels/src, the one at DEFECT turning the
causal_off_by_one switch on (every later one keeps it) and the one at BROKEN not compiling. The
`kernel_repo` fixture (tests/conftest.py) builds it once per test session; bisections over it
(tests/unit/triage, tests/unit/api, tests/unit/ci, tests/integration) must find shas[DEFECT].

`build_two_bug_repo`: TWO_BUG_COMMITS commits, causal_off_by_one turned on at TWO_BUGS[0] and
floor_blocks_per_split at TWO_BUGS[1] (the `two_bug_repo` fixture): two bugs, each with its own
first bad commit.
"""
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


TWO_BUG_COMMITS = 7
TWO_BUGS = {2: "causal_off_by_one", 5: "floor_blocks_per_split"}


def build_kernel_repo(repo: Path, commits: int = COMMITS, switches: dict[int, str] | None = None,
                      broken: int | None = BROKEN) -> list[str]:
    """`commits` commits of kernels/src in `repo` (an empty folder), commit i turning on the defect
    switches[i] (default: DEFECT's causal_off_by_one) for itself and every later commit, the one
    at `broken` not compiling; their ids, oldest first."""
    switches = {DEFECT: "causal_off_by_one"} if switches is None else switches
    _git(repo, "init", "--quiet", "-b", "main")
    src = repo / "kernels" / "src"
    shutil.copytree(SRC_DIR, src)
    entry = src / "attention.hip"
    pristine = entry.read_text()
    shas = []
    for i in range(commits):
        text = pristine
        for at, name in sorted(switches.items()):
            if i >= at:
                text = f"#define ATTN_DEFECT_{name.upper()}\n" + text
        if i == broken:
            text += "\nthis line is not C++;\n"
        entry.write_text(text + "".join(f"// revision {j}\n" for j in range(i + 1)))
        _git(repo, "add", "-A")
        _git(repo, "commit", "--quiet", "-m", f"revision {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


def build_two_bug_repo(repo: Path) -> list[str]:
    """TWO_BUG_COMMITS commits, the defects of TWO_BUGS turned on at their commits; their ids."""
    return build_kernel_repo(repo, TWO_BUG_COMMITS, TWO_BUGS, broken=None)
