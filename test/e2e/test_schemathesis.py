"""Issue 18: schema-driven fuzzing of every operation /openapi.json declares (bodies from the
pydantic models; valid and invalid data), bounded to a few minutes: no 5xx, and each response
matches the schema declared for its status. The server runs with a short context so that no
generated request can ask for minutes of decoding."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from .server import ServerProcess


@pytest.fixture(scope="module")
def fuzzed(tiny_path):
    s = ServerProcess("--skip-server-warmup", "--context-length", "48", "--max-running-requests", "8")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    schema = schemathesis.openapi.from_url(fuzzed.base_url + "/openapi.json")
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    return schema


def test_openapi_declares_the_request_bodies(fuzzed):
    spec = fuzzed.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/abort_request"):
        assert "requestBody" in spec["paths"][path]["post"], path
    assert "ChatCompletionRequest" in spec["components"]["schemas"]


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_responses_match_the_schema(case, fuzzed):
    case.call_and_validate(base_url=fuzzed.base_url, timeout=60,
                           checks=[not_a_server_error, response_schema_conformance])  # fmt: skip


def test_pools_are_idle_after_the_fuzzing(fuzzed):
    fuzzed.wait_idle_baseline()
