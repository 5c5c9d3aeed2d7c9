"""What every part of the compose smoke shares: the project's paths, the images' names, the log,
and running a command with a time limit (standard library only, as the whole smoke)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:   # harness/ (free ports, HTTP to loopback) from the checkout
    sys.path.insert(0, str(ROOT))
SMOKE = ROOT / "deploy" / "smoke"
OVERRIDE = SMOKE / "docker-compose.smoke.yml"
BASE_IMAGE = os.environ.get("ATTNSWEEP_SMOKE_BASE_IMAGE", "attnsweep-smoke-base:bookworm")
APP_IMAGE = "attnsweep-smoke:latest"
POSTGRES_IMAGE = "attnsweep-smoke-postgres:latest"
REDIS_IMAGE = "attnsweep-smoke-redis:latest"
DEBIAN_MIRROR = os.environ.get("ATTNSWEEP_SMOKE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SERVICES = ["postgres", "redis", "migrate", "api", "worker-cpu", "flower"]
NODE = "smoke"
WORKER = f"cpu@{NODE}"
T0 = time.monotonic()


class SmokeFailure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[compose-smoke {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def run(cmd: list[str], *, timeout: float, capture: bool = False, check: bool = True,
        env: dict[str, str] | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    if not quiet:
        log("$ " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, text=True,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.STDOUT if capture else None)
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"timed out after {timeout:.0f} s: {' '.join(cmd)}") from None
    if check and proc.returncode != 0:
        tail = ("\n" + proc.stdout[-3000:]) if capture and proc.stdout else ""
        raise SmokeFailure(f"exit {proc.returncode}: {' '.join(cmd)}{tail}")
    return proc


def image_exists(name: str) -> bool:
    return run(["docker", "image", "inspect", name], timeout=60, capture=True, check=False, quiet=True).returncode == 0


def image_size_mb(name: str) -> float:
    out = run(["docker", "image", "inspect", "-f", "{{.Size}}", name], timeout=60, capture=True, quiet=True).stdout
    return int(out.strip()) / 1e6
