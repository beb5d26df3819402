"""Issue 18: schema-driven fuzzing of every operation /openapi.json declares (bodies from the
pydantic models; valid and invalid data), bounded to a few minutes: no 5xx, and each response
matches the schema declared for its status. The server runs with a short context so that no
generated request can ask for minutes of decoding."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from .server import ServerProcess

EXAMPLES = 60  # per operation with a body and mode: a couple of minutes in all on the CI box


@pytest.fixture(scope="module")
def fuzzed(tiny_path):
    s = ServerProcess("--skip-server-warmup", "--context-length", "48", "--max-running-requests", "8")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    schema = schemathesis.openapi.from_url(fuzzed.base_url + "/openapi.json")
    return schema


def test_openapi_declares_the_request_bodies(fuzzed):
    spec = fuzzed.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/abort_request"):
        assert "requestBody" in spec["paths"][path]["post"], path
    assert "ChatCompletionRequest" in spec["components"]["schemas"]


BODIES = ["POST /v1/chat/completions", "POST /v1/completions", "POST /abort_request", "POST /generate"]
NO_BODY = ["GET /v1/models", "GET /health", "GET /get_model_info", "GET /get_load"]
VALID, INVALID = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
CASES = [(op, VALID) for op in BODIES + NO_BODY] + [(op, INVALID) for op in BODIES]  # GETs take no input


@pytest.mark.parametrize("label, mode", CASES, ids=[f"{m.value}-{op}" for op, m in CASES])
def test_no_5xx_and_responses_match_the_schema(api_schema, fuzzed, label, mode):
    # schemathesis' pytest plugin does not run under this pytest; hypothesis drives its strategy directly
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, f"/openapi.json has no {label}"
    if label == "POST /generate" and "requestBody" not in operation.definition.raw:
        pytest.skip("/openapi.json declares no /generate body yet (its pydantic model is issue 18's other half)")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES if label in BODIES else 5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def fuzz(case):
        case.call_and_validate(base_url=fuzzed.base_url, timeout=60,
                               checks=[not_a_server_error, response_schema_conformance])  # fmt: skip

    fuzz()


def test_pools_are_idle_after_the_fuzzing(fuzzed):
    fuzzed.wait_idle_baseline()
