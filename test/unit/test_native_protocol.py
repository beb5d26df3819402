"""The native /generate body model without a server: nulls become the defaults, a capability this
server lacks is accepted only at its neutral value, batch fields must match the batch."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sgl_inkling.entrypoints.native_protocol import METADATA, UNSUPPORTED, GenerateRequest
from sgl_inkling.entrypoints.request_schema import validation_text


def parse(body: dict):
    return GenerateRequest.model_validate(body).to_input()


def refused(body: dict) -> str:
    with pytest.raises(ValidationError) as e:
        GenerateRequest.model_validate(body)
    return validation_text(e.value)


def test_nulls_are_the_defaults():
    nulls = {"text": "hi", "return_logprob": None, "logprob_start_len": None, "top_logprobs_num": None,
             "stream": None, "sampling_params": {"temperature": None, "n": None, "stop": None}}  # fmt: skip
    obj = parse(nulls)
    assert (obj.return_logprob, obj.logprob_start_len, obj.top_logprobs_num, obj.stream) == (False, -1, 0, False)
    assert obj.sampling_params == {}
    batch = parse({"text": ["a", "b"], "return_logprob": [None, True], "top_logprobs_num": [2, None]})
    assert batch.return_logprob == [False, True] and batch.top_logprobs_num == [2, 0]


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_fields_only_at_their_neutral_value(name):
    neutral, why = UNSUPPORTED[name]
    for value in neutral:
        parse({"text": "hi", name: value})
    message = refused({"text": "hi", name: "something"})
    assert name in message and why in message


def test_metadata_is_accepted_with_any_value():
    values = {"model": "m", "session_id": "s", "log_metrics": False, "no_logs": True, "custom_labels": {"a": "b"},
              "routing_key": "k", "conversation_id": "c", "external_trace_header": {"t": 1}, "received_time": 1.5}  # fmt: skip
    assert set(values) == set(METADATA)
    assert parse({"text": "hi", **values}).text == "hi"


def test_dp_rank_spellings():
    assert parse({"text": "hi", "routed_dp_rank": 1}).data_parallel_rank == 1
    assert parse({"text": "hi", "data_parallel_rank": 0}).data_parallel_rank == 0
    assert "disagree" in refused({"text": "hi", "data_parallel_rank": 0, "routed_dp_rank": 1})


def test_batch_shapes():
    assert parse({"input_ids": [[1], [2, 3]], "rid": ["a", "b"]}).rid == ["a", "b"]
    assert "image_data" in refused({"text": ["a", "b"], "image_data": ["x.png"]})
    assert "exactly one" in refused({"sampling_params": {}})
    assert "exactly one" in refused({"text": "a", "input_ids": [1]})
    assert "rid" in refused({"text": "a", "rid": ["x"]})
    assert "stop" in refused({"text": "a", "sampling_params": {"stop": ["s"] * 33}})
    assert "stop_regex" in refused({"text": "a", "sampling_params": {"stop_regex": "a" * 300}})
    assert "temperature" in refused({"text": "a", "sampling_params": {"temperature": "hot"}})
