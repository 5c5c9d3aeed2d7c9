"""The Dockerfile, the smoke test's compose override and the installed package's data files,
checked without a Docker engine (`make compose-smoke` builds and runs them where one runs).

The override may only swap in the PostgreSQL and Redis images built from Debian's packages
(and pass the worker a setting): anything more would make the smoke test run something other
than what users run.
"""
from __future__ import annotations

import json
import re
import tomllib
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
OVERRIDE = ROOT / "deploy" / "smoke" / "docker-compose.smoke.yml"
SECRET_WORD = re.compile(r"PASSWORD|TOKEN|SECRET|AUTH|CA_BUNDLE|CERT", re.IGNORECASE)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def override() -> dict:
    return yaml.safe_load(OVERRIDE.read_text())


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(m[1].upper(), m[2]) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", joined, re.MULTILINE)]


def test_the_override_is_valid_and_only_swaps_the_database_and_broker_images(override, compose):
    path = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(path.read_text())
    errors = list(jsonschema.validators.validator_for(schema)(schema).iter_errors(override))
    assert not errors, [e.message for e in errors]
    assert set(override) == {"services"}
    services = override["services"]
    assert set(services) <= set(compose["services"])
    assert {k for k in services["postgres"]} == {"image"} and {k for k in services["redis"]} == {"image"}
    for name, svc in services.items():
        assert set(svc) <= {"image", "environment"}, f"{name} overrides {sorted(set(svc) - {'image', 'environment'})}"
        for key in svc.get("environment") or {}:
            assert not SECRET_WORD.search(key), f"{name}: the override sets {key}"


def test_ports_are_published_on_a_settable_address_and_compose_1_29_reads_the_file(compose):
    for name, port in (("api", "8000"), ("flower", "5555")):
        (spec,) = compose["services"][name]["ports"]
        assert spec.startswith("${ATTNSWEEP_BIND_ADDRESS:-0.0.0.0}:") and spec.endswith(f":{port}"), spec
    # docker-compose 1.29 (Debian's) refuses a top-level `name`.
    assert set(compose) <= {"services", "volumes", "networks", "x-app"}


def test_the_default_build_is_the_official_python_image_and_compose_builds_for_the_gpu(compose):
    args = dict(re.findall(r"^ARG (\w+)=(\S*)$", DOCKERFILE, re.MULTILINE))
    assert args["BASE_IMAGE"].startswith("python:3.")
    assert args["EXTRAS"] == "flower"  # no GPU runtime in the official image's default build
    build = compose["x-app"]["build"]["args"]
    assert "nvidia/cuda" in build["BASE_IMAGE"] and "cuda" in build["EXTRAS"].split("${ATTNSWEEP_EXTRAS:-")[1]


def test_the_image_bakes_no_secret_and_reads_the_ca_bundle_only_as_a_build_secret():
    steps = _instructions(DOCKERFILE)
    for kind, argsline in steps:
        if kind in ("ARG", "ENV", "LABEL"):
            names = re.findall(r"(\w+)=", argsline) or [argsline.split()[0]]
            assert not any(SECRET_WORD.search(n) for n in names), f"{kind} {argsline}"
        if kind in ("COPY", "ADD"):
            assert not re.search(r"\.(pem|crt|key)\b|wheelhouse", argsline), f"{kind} {argsline}"
    pip_steps = [a for k, a in steps if k == "RUN" and "attnsweep-pip-install" in a]
    assert len(pip_steps) == 2
    for step in pip_steps:
        assert "--mount=type=secret,id=ca_bundle,required=false" in step
        assert "--mount=type=bind,source=docker/wheelhouse,target=/wheelhouse" in step
    script = (ROOT / "docker" / "pip-install.sh").read_text()
    # The combined bundle lives in a temporary directory removed when the script ends.
    assert "trap 'rm -rf \"$tmp\"' EXIT" in script and "exec pip" not in script


def test_the_image_runs_unprivileged_with_a_healthcheck():
    steps = _instructions(DOCKERFILE)
    users = [a.strip() for k, a in steps if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert [k for k, _ in steps].index("USER") > max(i for i, (k, _) in enumerate(steps) if k == "RUN")
    (check,) = [a for k, a in steps if k == "HEALTHCHECK"]
    assert "/healthz" in check


def test_every_data_file_of_an_installed_package_is_package_data():
    """An installed (not editable) package, as in the image, carries only .py files and the
    package-data globs: a template or script left out is a 500 in the container only."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    globs = project["tool"]["setuptools"]["package-data"]
    missing = []
    for package in packages:
        for path in (ROOT / package).rglob("*"):
            if (not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts
                    or path.name == "README.md"):
                continue
            rel = path.relative_to(ROOT / package).as_posix()
            if not any(fnmatch(rel, g) for g in globs.get(package, [])):
                missing.append(f"{package}/{rel}")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
