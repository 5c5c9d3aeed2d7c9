"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The schema is the Compose Specification's (github.com/compose-spec/compose-spec,
schema/compose-spec.json, Apache-2.0) as vendored by the check-jsonschema package
(check_jsonschema/builtin_schemas/vendor/compose-spec.json). On top of the schema: every
depends_on target exists, long-running services have healthchecks, secrets come only from the
environment with no default, and the GPU worker reserves the GPU it pins.
"""
from __future__ import annotations

import json
import re
import tomllib
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from settings import PLACEHOLDER_SECRETS

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|AUTH", re.IGNORECASE)
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?+])?([^}]*)\}")
SERVICES = {"postgres", "redis", "migrate", "api", "worker-gpu", "worker-cpu", "flower"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _compose_schema() -> dict:
    path = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return json.loads(path.read_text())


def _strings(obj) -> list[str]:  # noqa: ANN001
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in _strings(k) + _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return [obj] if isinstance(obj, str) else []


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def test_file_is_valid_against_the_compose_specification(compose):
    schema = _compose_schema()
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_check_can_fail(compose):
    broken = json.loads(json.dumps(compose))
    broken["services"]["api"]["healthcheck"]["interval"] = ["not", "a", "duration"]
    broken["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] = "many"
    schema = _compose_schema()
    assert len(list(jsonschema.validators.validator_for(schema)(schema).iter_errors(broken))) >= 2


def test_every_service_of_the_deployment_is_there(compose):
    assert set(compose["services"]) == SERVICES


def test_depends_on_targets_exist_and_conditions_fit_them(compose):
    services = compose["services"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on missing service {dep}"
            condition = cond.get("condition", "service_started")
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
            if condition == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} must be one-shot for {name} to wait for it"
    for name in ("api", "worker-gpu", "worker-cpu"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_long_running_services_have_healthchecks(compose):
    for name, svc in compose["services"].items():
        if svc.get("restart") == "no":
            continue
        check = svc.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), f"{name} has no healthcheck"


def test_secrets_come_from_the_environment_without_defaults(compose):
    for name, svc in compose["services"].items():
        for key, value in _environment(svc).items():
            for var, op, _rest in VAR.findall(value):
                if SECRET_NAME.search(var):
                    assert op == ":?", f"{name}.{key}: ${{{var}}} must be required (:?), never defaulted"
            if SECRET_NAME.search(key) and not key.endswith("_URL"):
                assert VAR.fullmatch(value), f"{name}.{key} must be exactly one required variable, not a literal"
        assert "${POSTGRES_PASSWORD:?" in _environment(svc).get("ATTNSWEEP_DATABASE_URL", "${POSTGRES_PASSWORD:?")
    placeholders = PLACEHOLDER_SECRETS - {"token", "secret", "password"}  # those three also name variables
    for text in _strings(compose):
        for word in re.findall(r"[A-Za-z0-9_-]+", text):
            assert word.lower() not in placeholders, f"placeholder {word!r} in {text!r}"
    raw = COMPOSE.read_text()
    assert not re.search(r"(?i)(password|token)\s*[:=]\s*['\"]?(changethis|changeme|secret)\b", raw)


def test_gpu_worker_reserves_the_gpu_it_pins_and_the_cpu_worker_none(compose):
    gpu = compose["services"]["worker-gpu"]
    command = gpu["command"]
    assert command[:4] == ["attnsweep", "worker", "--queue", "gpu"]
    # The container sees only the GPU it reserves, as its device 0: the worker pins index 0
    # and is named after the host's GPU it reserved.
    assert command[command.index("--gpu") + 1] == "0"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1 and len(devices[0]["device_ids"]) == 1
    assert devices[0] == {"driver": "nvidia", "device_ids": devices[0]["device_ids"], "capabilities": ["gpu"]}
    assert command[command.index("--name") + 1].startswith(f"gpu{devices[0]['device_ids'][0]}@")
    cpu = compose["services"]["worker-cpu"]
    assert cpu["command"][:4] == ["attnsweep", "worker", "--queue", "cpu"] and "deploy" not in cpu


def test_migrate_is_the_one_shot_schema_upgrade(compose):
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["attnsweep", "db", "upgrade"] and migrate["restart"] == "no"


def test_dockerfile_copies_every_package_the_project_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", dockerfile, re.MULTILINE))
    assert packages <= copied, f"the image would miss {sorted(packages - copied)}"
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.MULTILINE), "the image must not run as root"


def test_the_ci_webhook_is_configured_for_every_app_service(compose):
    from settings import Settings

    for name in ("api", "worker-gpu", "worker-cpu"):
        env = _environment(compose["services"][name])
        assert env["ATTNSWEEP_WEBHOOK_SECRET"].startswith("${ATTNSWEEP_WEBHOOK_SECRET:?")
        assert "ATTNSWEEP_KERNEL_REPO" in env
        # Mirrors of the kernel repository persist on the cache volume, not in the container.
        assert env["ATTNSWEEP_KERNEL_REPO_CACHE"].startswith("/cache/")
        for key in env:  # every variable the compose file sets is a setting the service reads
            if key.startswith("ATTNSWEEP_"):
                assert key.removeprefix("ATTNSWEEP_").lower() in Settings.model_fields, key
