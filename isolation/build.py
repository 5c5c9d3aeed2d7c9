"""A build command of code that did not ship (a repository's attnsweep.toml), run confined.

The command runs as sandbox.Confinement runs any program: no network of the host, no secret in
its environment, the sandbox uid, the rlimits of ATTNSWEEP_SANDBOX_*; besides the system's
read-only folders it sees one folder, the exported tree, writable, and starts in it. Its
output goes to a log file outside that folder (its size bounded by the file-size rlimit), of
which the end is kept; ATTNSWEEP_BUILD_TIME_LIMIT_S bounds its wall-clock time.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from isolation.sandbox import Confinement
from settings import Settings

LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class BuildRun:
    ok: bool
    reason: str     # why it failed, one line ("" when ok)
    log_tail: str   # the end of what it printed


def _give_to_sandbox(folder: Path, uid: int, gid: int) -> None:
    """Every entry under `folder` owned by the sandbox uid, so the build may write where its
    files are (the confinement itself hands over only the folder)."""
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), uid, gid)
    os.lchown(folder, uid, gid)


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4 * chars))
            text = f.read().decode("utf-8", "replace").replace("\x00", "\\0")
    except OSError:
        return ""
    return text[-chars:].strip()


def run_build(argv: Sequence[str], folder: Path, settings: Settings, log_path: Path) -> BuildRun:
    """Run `argv` confined in `folder` (writable, its working directory). Raises
    sandbox.SandboxUnavailable where nothing can be confined on this host."""
    confinement = Confinement.of(settings, writable=(str(folder),), cwd=str(folder))
    if confinement.drops_uid:
        _give_to_sandbox(folder, confinement.uid, confinement.gid)
    limit = settings.build_time_limit_s
    with open(log_path, "wb") as log:
        proc = confinement.popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return BuildRun(False, f"the build took longer than {limit} s (ATTNSWEEP_BUILD_TIME_LIMIT_S) and was "
                                   "killed", log_tail(log_path))
    if code == 0:
        return BuildRun(True, "", log_tail(log_path))
    # bubblewrap passes on its program's death by a signal as 128 + the signal's number.
    how = f"was killed by signal {code - 128}" if code > 128 else f"exited with status {code}"
    return BuildRun(False, f"the build command {how}", log_tail(log_path))
