"""The smoke's images: a Debian base made with debootstrap (cached), the attnsweep image and
PostgreSQL and Redis images built on it with BuildKit, and the air-gapped build from a wheelhouse."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from smoke_run import BASE_IMAGE, DEBIAN_MIRROR, ROOT, SmokeFailure, image_exists, image_size_mb, log, run


def ensure_base() -> str:
    """The Debian bookworm minbase image the other three build on; made once, then reused."""
    if image_exists(BASE_IMAGE):
        log(f"base image {BASE_IMAGE}: cached ({image_size_mb(BASE_IMAGE):.0f} MB)")
        return "cached"
    if not shutil.which("debootstrap"):
        raise SmokeFailure("debootstrap is missing (apt-get install debootstrap)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnsweep-smoke-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR], timeout=900,
            capture=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, timeout=600,
                             capture_output=True, text=True)
        tar.stdout.close()
        if tar.wait(timeout=60) != 0 or imp.returncode != 0:
            raise SmokeFailure(f"docker import failed: {imp.stderr[-2000:]}")
    took = time.monotonic() - start
    log(f"base image {BASE_IMAGE}: debootstrap + import {took:.0f} s, {image_size_mb(BASE_IMAGE):.0f} MB")
    return f"{took:.0f} s"


def buildkit_docker() -> list[str]:
    """A docker client that builds with BuildKit (the Dockerfile mounts secrets): `docker` with
    buildx, else a client of Docker 20.10-22 with DOCKER_BUILDKIT=1 (Debian's /usr/bin/docker)."""
    probe = f"FROM {BASE_IMAGE}\nRUN --mount=type=secret,id=probe,required=false true\n"
    for client in ("docker", "/usr/bin/docker"):
        if not shutil.which(client):
            continue
        proc = subprocess.run([client, "build", "-q", "-"], input=probe, text=True, capture_output=True,
                              env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=120)
        if proc.returncode == 0:
            return [client]
    raise SmokeFailure("no docker client builds with BuildKit here (install docker-buildx, or Docker 20.10+)")


def build(client: list[str], tag: str, context: Path, dockerfile: Path, args: dict[str, str],
          secrets_: dict[str, str]) -> float:
    cmd = [*client, "build", "--progress=plain", "-t", tag, "-f", str(dockerfile)]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    for k, v in secrets_.items():
        cmd += ["--secret", f"id={k},src={v}"]
    start = time.monotonic()
    proc = run([*cmd, str(context)], timeout=1500, capture=True, check=False,
               env={**os.environ, "DOCKER_BUILDKIT": "1"})
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise SmokeFailure(f"building {tag} failed:\n{proc.stdout[-4000:]}")
    cached = sum(1 for line in proc.stdout.splitlines() if line.endswith(" CACHED"))
    log(f"built {tag}: {took:.1f} s ({cached} steps cached), {image_size_mb(tag):.0f} MB")
    return took


def airgapped_build(client: list[str]) -> list[str]:
    """The Dockerfile without any network: a base that already has Python, venv and git (so apt
    is not needed), the wheels in docker/wheelhouse built beforehand by that base's own pip,
    `docker build --network=none`; then a sweep in the image, still without a network. The
    wheels are removed afterwards."""
    report = []
    base_py = "attnsweep-smoke-base-py:bookworm"
    prep = (f"FROM {BASE_IMAGE}\nRUN apt-get update -q && apt-get install -y -q --no-install-recommends "
            "python3 python3-venv git ca-certificates && apt-get clean && rm -rf /var/lib/apt/lists/*\n")
    proc = subprocess.run([*client, "build", "-q", "-t", base_py, "-"], input=prep, text=True, capture_output=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=900)
    if proc.returncode != 0:
        raise SmokeFailure(f"building {base_py}: {proc.stderr[-2000:]}")
    wheelhouse = ROOT / "docker" / "wheelhouse"
    ca = os.environ.get("ATTNSWEEP_SMOKE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    ca_args = ["-v", f"{ca}:/run/ca.pem:ro", "-e", "PIP_CERT=/run/ca.pem"] if Path(ca).is_file() else []
    try:
        start = time.monotonic()
        # The base's own Python resolves the requirements: environment markers depend on its
        # exact version (redis needs async-timeout below Python 3.11.3, for one).
        run(["docker", "run", "--rm", "-v", f"{ROOT}:/src:ro", "-v", f"{wheelhouse}:/out", *ca_args, base_py,
             "sh", "-c", "python3 -m venv /tmp/v && mkdir /tmp/p && tar -C /src --exclude=./.venv --exclude=./.git "
             "--exclude=./docker/wheelhouse -c . | tar -C /tmp/p -x && "
             "/tmp/v/bin/pip wheel -q --disable-pip-version-check -w /out '/tmp/p[flower]' 'setuptools>=69'"],
            timeout=900, capture=True)
        for own in wheelhouse.glob("attnsweep-*.whl"):
            own.unlink()
        wheels = sorted(wheelhouse.glob("*.whl"))
        report.append(f"air-gapped: {len(wheels)} wheels "
                      f"({sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB) in docker/wheelhouse by the base's pip in "
                      f"{time.monotonic() - start:.0f} s")
        tag = "attnsweep-smoke-airgapped:latest"
        start = time.monotonic()
        proc = run([*client, "build", "--progress=plain", "--no-cache", "--network=none", "-t", tag,
                    "--build-arg", f"BASE_IMAGE={base_py}", str(ROOT)], timeout=1500, capture=True, check=False,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if proc.returncode != 0 or "no index" not in proc.stdout:
            raise SmokeFailure(f"air-gapped build failed:\n{proc.stdout[-4000:]}")
        report.append(f"air-gapped: `docker build --network=none --no-cache` from the wheelhouse {time.monotonic() - start:.0f} s, "
                      f"{image_size_mb(tag):.0f} MB")
        out = run(["docker", "run", "--rm", "--network", "none", tag, "sh", "-c",
                   "attnsweep run --samples 6 --seed 3 --backend cpu --db sqlite:////tmp/s.db --report-json /tmp/r.json"
                   " >/dev/null && python -c \"import json; r = json.load(open('/tmp/r.json')); "
                   "print(r.get('outcomes') or r)\""],
                  timeout=300, capture=True).stdout.strip().splitlines()[-1]
        report.append(f"air-gapped image, no network: `attnsweep run --samples 6 --backend cpu`: {out[:200]}")
        run(["docker", "rmi", tag], timeout=120, capture=True, quiet=True, check=False)
    finally:
        for w in wheelhouse.glob("*.whl"):
            w.unlink()
    return report
