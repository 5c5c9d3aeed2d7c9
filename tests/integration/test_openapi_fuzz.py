"""Every operation of the OpenAPI, fuzzed by schemathesis against the app on the real PostgreSQL:
no request may end in a server error (500), every answer is one the OpenAPI documents (status,
content type, body), and every request the schema forbids is refused. Bounded and seeded: a fixed number of examples per
operation, derandomized, so a run is repeatable.

The API runs in-process on a database of its own (int4/int8 overflows, NUL characters and lone
surrogates are refused by PostgreSQL, not by SQLite) with kombu's in-memory broker; sweeps are
capped small (ATTNSWEEP_MAX_SWEEP_CONFIGS, ATTNSWEEP_MAX_DRAWS) so a generated request costs
little to plan.
"""
from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = 60   # per operation, valid and invalid mixed
# Operations whose answers are deliberate 5xx: none. 503 is the documented answer of an
# unavailable dependency and is not what this test looks for; 500 is.
SERVER_ERROR = 500


def test_openapi_has_no_server_errors(pg_url) -> None:  # noqa: ANN001
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                                   response_schema_conformance, status_code_conformance)
    from hypothesis import HealthCheck, given, settings as hsettings

    CONFORMANCE = [status_code_conformance, content_type_conformance, response_schema_conformance,
                   negative_data_rejection]

    from api.main import create_app
    from settings import Settings
    from store.migrate import upgrade
    from tests.conftest import AUTH, TEST_TOKENS

    upgrade(pg_url)
    app = create_app(Settings(database_url=pg_url, broker_url="memory://", queue_prefix="fuzz-", max_sweep_configs=20,
                              max_draws=20_000, webhook_secret="fuzz-webhook-key-0123456789", api_tokens=TEST_TOKENS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    # A sweep to read, cancel and re-run, so the id paths reach their handlers too.
    with TestClient(app, headers=AUTH) as client:
        seed = client.post("/sweeps", json={"samples": 3, "backend": "cpu", "seed": 1, "label": "fuzz"})
        assert seed.status_code == 202, seed.text
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    seen = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        # Valid requests by the schema and invalid ones (out-of-range integers, wrong types).
        strategy = operation.as_strategy(generation_mode=GenerationMode.POSITIVE) | operation.as_strategy(
            generation_mode=GenerationMode.NEGATIVE)

        @given(case=strategy)
        @hsettings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                   suppress_health_check=list(HealthCheck))
        def run(case) -> None:  # noqa: ANN001
            nonlocal seen
            seen += 1
            try:
                response = case.call(headers=AUTH)
            except Exception as exc:  # noqa: BLE001 - the in-process client raises what would be a 500
                failures.append(f"{case.method} {case.formatted_path} {case.query} {case.body!r:.200} -> "
                                f"{type(exc).__name__}: {str(exc)[:200]}")
                return
            if response.status_code >= SERVER_ERROR and response.status_code != 503:
                failures.append(f"{case.method} {case.formatted_path} {case.query} {case.body!r:.200} -> "
                                f"{response.status_code} {response.text[:200]}")
                return
            # The answer is what the OpenAPI says it is: a documented status, content type and
            # body, and a request the schema forbids is refused.
            try:
                case.validate_response(response, checks=CONFORMANCE)
            except Exception as exc:  # noqa: BLE001 - schemathesis raises its failures grouped
                failures.append(f"{case.method} {case.formatted_path} {case.query} {case.body!r:.200} -> "
                                f"{response.status_code}: {str(exc)[:300]}")

        run()
    assert seen >= 17 * 10, f"only {seen} requests were made"
    assert not failures, f"{len(failures)} failures of {seen} requests:\n" + "\n".join(failures[:20])
