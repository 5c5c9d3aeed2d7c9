"""Every property of every request and response model, and every parameter, is described in /openapi.json."""
from __future__ import annotations


def _undescribed(spec: dict) -> list[str]:
    missing = []
    for name, schema in spec["components"]["schemas"].items():
        for prop, sub in schema.get("properties", {}).items():
            if not sub.get("description"):
                missing.append(f"{name}.{prop}")
    for path, item in spec["paths"].items():
        for method, op in item.items():
            for param in op.get("parameters", []):
                if not (param.get("description") or param.get("schema", {}).get("description")):
                    missing.append(f"{method.upper()} {path} ?{param['name']}")
    return missing


def test_every_field_and_parameter_has_a_description(client):
    spec = client.get("/openapi.json").json()
    assert len(spec["components"]["schemas"]) > 10
    missing = _undescribed(spec)
    assert not missing, f"{len(missing)} without a description: {missing}"


def test_the_walk_sees_a_missing_description():
    spec = {"components": {"schemas": {"M": {"properties": {"a": {"type": "integer", "description": "x"}, "b": {"type": "string"}}}}},
            "paths": {"/x": {"get": {"parameters": [{"name": "q", "in": "query", "schema": {}}]}}}}
    assert _undescribed(spec) == ["M.b", "GET /x ?q"]
