"""The confinement of code that did not ship: bubblewrap, and a real unprivileged uid under it.

A confined process is started as
`bwrap <namespaces> <mounts> -- setpriv <uid> -- prlimit <limits> -- <program>`:
- bubblewrap (Debian's `bubblewrap`, Flatpak's sandbox) gives it new PID, network, IPC and UTS
  namespaces (a network of its own: its own loopback and nothing else, so no service of the
  host, on loopback or anywhere, can be reached) and a root of its own: an empty
  tmpfs holding read-only binds of /usr (with /bin and /lib as its links), the dynamic
  loader's cache, the Python installation and the project's own packages, a private writable
  /tmp (a tmpfs of ATTNSWEEP_SANDBOX_TMP_BYTES), fresh /proc and a minimal /dev; GPU runs also
  get the GPU's device nodes and a read-only /sys. Nothing else of the host exists inside: no
  /home, /root, /etc/shadow, database, repository mirror or kernel cache but the one folder the
  caller lends it.
- where the service runs as root, util-linux's `setpriv` then drops to ATTNSWEEP_SANDBOX_UID
  and its gid, with no supplementary groups, no capabilities and no_new_privs: a uid mapped to
  nobody inside a user namespace is still root outside it and reads what root reads, a real
  unprivileged uid does not. Where root may not mount (a container without CAP_SYS_ADMIN),
  the uid is dropped before bubblewrap instead, which then builds the sandbox in an
  unprivileged user namespace of that uid (MODES; `check` picks the first that runs here). Run as
  another user, the process keeps that user's uid, in an unprivileged user namespace.
- util-linux's `prlimit` sets its rlimits: CPU seconds, memory, file size, processes, no core.
- bubblewrap's own process (PID 1 inside) is started with an environment of a few fixed
  variables, and the program with only those given here: nothing of the service's
  environment (no ATTNSWEEP_*, no token, no password) reaches it, not even through
  /proc/1/environ. It dies with its parent (--die-with-parent), and every process it started
  dies with its PID namespace.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

from settings import Settings

# What the program finds on its PATH inside (the compiler hostemu runs included).
PATH = "/usr/local/bin:/usr/bin:/bin"
# The environment every confined program gets, besides what its caller names.
BASE_ENV = {"PATH": PATH, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1"}
# GPU device nodes: NVIDIA's (control, UVM, each GPU) and AMD's (KFD and the render nodes).
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia[0-9]*", "/dev/nvidia-caps/*",
             "/dev/kfd", "/dev/dri/renderD*")
# The CUDA toolkit's headers and libraries NVRTC reads (read-only), where the host has them.
GPU_TREES = ("/usr/local/cuda", "/opt/rocm")
# The top-level folders a merged-/usr system keeps as links into /usr.
TOP_LINKS = ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")
# The dynamic loader's files under /etc; the rest of /etc is not the program's business.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")


# How the uid is dropped (`check` picks the first that works on this host):
# "setpriv": bubblewrap as root, setpriv inside; "userns": the sandbox uid before bubblewrap, an
# unprivileged user namespace; "user": the caller is not root and keeps its uid.
MODES = ("setpriv", "userns")


class SandboxUnavailable(RuntimeError):
    """Confinement cannot run on this host: its tools are missing or refuse to start. Code that
    did not ship never runs unconfined instead."""


@dataclass(frozen=True)
class Limits:
    """rlimits of a confined process (settings: ATTNSWEEP_SANDBOX_*)."""

    cpu_s: int
    memory_bytes: int
    file_bytes: int
    processes: int
    tmp_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> "Limits":
        return cls(settings.sandbox_cpu_s, settings.sandbox_memory_bytes, settings.sandbox_file_bytes,
                   settings.sandbox_processes, settings.sandbox_tmp_bytes)


@dataclass(frozen=True)
class Confinement:
    """What one confined process may see and use."""

    limits: Limits
    uid: int
    gid: int
    bwrap: str = "bwrap"
    gpu: bool = False
    read_only: tuple[str, ...] = ()       # host paths bound read-only at the same place
    writable: tuple[str, ...] = ()        # host folders bound read-write at the same place
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/tmp"                     # where the program starts (a bound folder, or the private /tmp)

    @classmethod
    def of(cls, settings: Settings, **fields) -> "Confinement":  # noqa: ANN003
        return cls(Limits.of(settings), settings.sandbox_uid, settings.sandbox_gid, settings.bwrap or "bwrap", **fields)

    @property
    def drops_uid(self) -> bool:
        """Whether the program runs as ATTNSWEEP_SANDBOX_UID (the caller is root) or keeps the caller's uid."""
        return os.geteuid() == 0

    def command(self, program: list[str], mode: str = "setpriv") -> list[str]:
        """The full command line that runs `program` confined, the uid dropped as `mode` says."""
        setpriv = self.drops_uid and mode == "setpriv"
        args = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--hostname", "confined"]
        if not setpriv:
            args.append("--unshare-user")
        made: set[str] = set()

        def parents(path: str) -> None:
            # bubblewrap makes a bind's missing parents 0700 root: the dropped uid could not pass.
            parts = Path(path).parts[1:-1]
            for i in range(1, len(parts) + 1):
                d = "/" + "/".join(parts[:i])
                if d not in made:
                    made.add(d)
                    args.extend(["--perms", "0755", "--dir", d])

        # /tmp first: a bind below it (a library folder under /tmp) goes on top of the tmpfs.
        args.extend(["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(self.limits.tmp_bytes),
                     "--tmpfs", "/tmp"])
        made.add("/tmp")
        for path in _mounts(self.read_only, self.gpu):
            parents(path)
            args.extend(["--ro-bind", path, path])
        for path in self.writable:
            parents(path)
            args.extend(["--bind", path, path])
        for link in TOP_LINKS:
            if os.path.islink(link):
                args.extend(["--symlink", os.readlink(link), link])
        if self.gpu:
            for node in _gpu_nodes():
                args.extend(["--dev-bind", node, node])
        args.extend(["--chdir", self.cwd, "--clearenv"])
        for key, value in {**BASE_ENV, **self.env}.items():
            args.extend(["--setenv", key, value])
        if setpriv:
            args.extend(["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                         "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                         "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"])
        else:
            args.append("--")
        args.extend(["prlimit", f"--cpu={self.limits.cpu_s}", f"--fsize={self.limits.file_bytes}", "--core=0",
                     # A GPU driver reserves address space it never backs: there the limit is on
                     # the data segment (what malloc and numpy take), elsewhere on all of it.
                     (f"--data={self.limits.memory_bytes}" if self.gpu else f"--as={self.limits.memory_bytes}")])
        if self.drops_uid:
            args.append(f"--nproc={self.limits.processes}")
        return [*args, "--", *program]

    def popen(self, program: list[str], **kwargs) -> subprocess.Popen:  # noqa: ANN003
        """Start `program` confined; bubblewrap itself gets BASE_ENV's PATH and nothing else."""
        mode = check(self.bwrap, self.uid, self.gid)
        for path in self.writable:
            if self.drops_uid:
                os.chown(path, self.uid, self.gid)
        return _spawn(self.command(program, mode), env={"PATH": BASE_ENV["PATH"]}, **_as_sandbox_uid(self, mode),
                      **kwargs)


_spawner: tuple[int, ThreadPoolExecutor] | None = None


def _spawn(*args: object, **kwargs: object) -> subprocess.Popen:
    """subprocess.Popen, called from one thread that lives as long as this process. bubblewrap's
    --die-with-parent (PR_SET_PDEATHSIG) fires when the thread that started it ends, not the
    process: a confined process started from a short-lived thread (a loader's, a request's)
    would be killed with that thread. One spawner per process (a forked child makes its own)."""
    global _spawner
    if _spawner is None or _spawner[0] != os.getpid():
        _spawner = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="confined-spawner"))
    return _spawner[1].submit(subprocess.Popen, *args, **kwargs).result()


def _as_sandbox_uid(c: Confinement, mode: str) -> dict:
    """Popen's arguments that start bubblewrap as the sandbox uid (mode "userns") or as the caller."""
    return dict(user=c.uid, group=c.gid, extra_groups=[]) if c.drops_uid and mode == "userns" else {}


def _mounts(read_only: Iterable[str], gpu: bool) -> list[str]:
    """Every read-only bind: the system's and the caller's, existing ones only, none twice or
    inside another (a bind inside a bound tree would hide nothing and cost a mount)."""
    # /bin, /lib ... are links into /usr on a merged-/usr system (made as links), folders elsewhere.
    system = ["/usr", *(d for d in TOP_LINKS if os.path.isdir(d) and not os.path.islink(d))]
    wanted = [*system, *ETC_FILES, *read_only, *(GPU_TREES if gpu else ()), *(("/sys",) if gpu else ())]
    real = []
    for path in wanted:
        path = os.path.normpath(path)
        if os.path.exists(path) and path not in real:
            real.append(path)
    real.sort(key=len)
    kept: list[str] = []
    for path in real:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return sorted(kept)


def _gpu_nodes() -> list[str]:
    return sorted({n for pattern in GPU_NODES for n in glob.glob(pattern)})


def python_paths(packages: Iterable[str]) -> tuple[list[str], list[str]]:
    """(read-only binds, PYTHONPATH) for a confined Python that imports `packages` of this
    project and the libraries this interpreter has: the interpreter's prefixes, every import
    path but the project's checkout, and of the checkout only the named packages' folders (the
    checkout holds the SQLite database, the git history and the settings files)."""
    import importlib

    roots = {Path(importlib.import_module(p).__file__).resolve().parent.parent for p in packages}
    binds = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    path_entries = []
    # sys.path[0] is the running script's folder (or the working directory): not a library
    # folder unless PYTHONPATH names it too.
    named = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    for i, entry in enumerate(sys.path):
        if not entry or not os.path.exists(entry) or (i == 0 and os.path.realpath(entry) not in named):
            continue
        resolved = Path(entry).resolve()
        if resolved in roots or str(resolved) in ("/", "/tmp"):
            continue
        binds.add(str(resolved))
        path_entries.append(str(resolved))
    for package in packages:
        folder = Path(importlib.import_module(package).__file__).resolve().parent
        binds.add(str(folder))
    return sorted(binds), [*(str(r) for r in sorted(roots)), *path_entries]


@lru_cache(maxsize=4)
def check(bwrap: str = "bwrap", uid: int = 61000, gid: int = 61000) -> str:
    """The mode that confines on this host (MODES; "user" when not root): the first in which a
    confined `true` runs. SandboxUnavailable with the reasons when bubblewrap, setpriv or prlimit
    is missing or no mode runs. Checked once per process."""
    for tool in (bwrap, "setpriv", "prlimit"):
        if shutil.which(tool) is None:
            raise SandboxUnavailable(f"{tool} is not installed on this host (Debian: apt-get install bubblewrap "
                                     "util-linux); code that did not ship is never run unconfined")
    probe = Confinement(Limits(10, 1 << 30, 1 << 20, 64, 16 << 20), uid, gid, bwrap)
    reasons = []
    for mode in MODES if probe.drops_uid else ("user",):
        try:
            done = subprocess.run(probe.command(["true"], mode), env={"PATH": PATH}, capture_output=True, timeout=30,
                                  **_as_sandbox_uid(probe, mode))
        except subprocess.TimeoutExpired:
            reasons.append(f"{mode}: no start within 30 s")
            continue
        if done.returncode == 0:
            return mode
        reasons.append(f"{mode}: {done.stderr.decode(errors='replace').strip()[:200]}")
    raise SandboxUnavailable("bubblewrap cannot start a confined process here: " + "; ".join(reasons))
