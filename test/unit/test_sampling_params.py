import json
import math

import pytest

from sgl_inkling.sampling.sampling_params import SamplingParams, SamplingParamsError


def test_defaults_match_sglang():
    p = SamplingParams()
    assert p.max_new_tokens == 128
    assert p.min_new_tokens == 0
    assert p.temperature == 1.0
    assert p.top_p == 1.0
    assert p.top_k == -1
    assert p.min_p == 0.0
    assert p.repetition_penalty == 1.0
    assert p.frequency_penalty == 0.0
    assert p.presence_penalty == 0.0
    assert p.stop is None and p.stop_token_ids is None
    assert p.ignore_eos is False
    assert p.skip_special_tokens is True
    assert p.spaces_between_special_tokens is True
    assert p.n == 1 and p.seed is None
    assert p.json_schema is None and p.regex is None and p.ebnf is None
    assert not p.is_greedy
    assert not p.needs_penalties
    p.validate(context_length=4096)


def test_from_dict_and_unknown_keys():
    p = SamplingParams.from_dict({"temperature": 0.5, "top_k": 20, "stop": ["a", "b"], "max_new_tokens": 7})
    assert (p.temperature, p.top_k, p.stop, p.max_new_tokens) == (0.5, 20, ["a", "b"], 7)
    assert SamplingParams.from_dict(None) == SamplingParams()
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams.from_dict({"temperature": 1.0, "tempreature": 0.3})
    assert "tempreature" in str(e.value)
    assert "unknown" in str(e.value)
    # Request-level logprob options are not sampling parameters.
    with pytest.raises(SamplingParamsError, match="return_logprob"):
        SamplingParams.from_dict({"return_logprob": True})
    # SGLang's newer spelling of the seed.
    assert SamplingParams.from_dict({"sampling_seed": 5}).seed == 5
    with pytest.raises(SamplingParamsError, match="sampling_seed"):
        SamplingParams.from_dict({"sampling_seed": 5, "seed": 6})


def test_greedy_threshold():
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=5e-7).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy


BAD_FIELDS = [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": math.nan}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"presence_penalty": math.nan}, "presence_penalty"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"min_new_tokens": -1}, "min_new_tokens"),
    ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens"),
    ({"n": 0}, "n"),
    ({"stop": ["ok", 3]}, "stop"),
    ({"stop": 42}, "stop"),
    ({"stop_token_ids": [1, -4]}, "stop_token_ids"),
    ({"stop_token_ids": ["x"]}, "stop_token_ids"),
    ({"seed": "abc"}, "seed"),
    ({"logit_bias": {"12": 200.0}}, "logit_bias"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
    ({"json_schema": "{}", "regex": "a+"}, "regex"),
    ({"regex": "a+", "ebnf": "root ::= 'a'"}, "ebnf"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
]


@pytest.mark.parametrize("fields,name", BAD_FIELDS, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD_FIELDS)])
def test_validate_names_the_field(fields, name):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**fields).validate()
    assert e.value.field == name
    assert str(e.value).startswith(name)
    assert isinstance(e.value, ValueError)


def test_validate_context_length():
    SamplingParams(max_new_tokens=100).validate(context_length=100)
    with pytest.raises(SamplingParamsError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=101).validate(context_length=100)
    # None: bounded by the context later on.
    SamplingParams(max_new_tokens=None).validate(context_length=100)


def test_valid_edge_values():
    SamplingParams(
        temperature=0.0,
        top_p=1.0,
        top_k=1,
        min_p=1.0,
        frequency_penalty=-2.0,
        presence_penalty=2.0,
        repetition_penalty=0.5,
        max_new_tokens=0,
        stop="x",
        stop_token_ids=[0, 3],
        logit_bias={"3": -100, 4: 100.0},
        json_schema='{"type": "object"}',
    ).validate()


def test_from_openai_basic():
    p = SamplingParams.from_openai(
        {
            "model": "m",
            "messages": [],
            "max_tokens": 33,
            "temperature": 0.2,
            "top_p": 0.9,
            "n": 3,
            "seed": 11,
            "stop": "###",
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
            "logprobs": True,
            "top_logprobs": 3,
            "stream": True,
            "logit_bias": {"50": 5},
        }
    ).validate()
    assert p.max_new_tokens == 33
    assert (p.temperature, p.top_p, p.n, p.seed) == (0.2, 0.9, 3, 11)
    assert p.stop == ["###"]
    assert (p.frequency_penalty, p.presence_penalty) == (0.5, -0.5)
    assert p.logit_bias_ids == {50: 5.0}


def test_from_openai_max_tokens_precedence_and_defaults():
    assert SamplingParams.from_openai({"max_tokens": 5, "max_completion_tokens": 9}).max_new_tokens == 9
    assert SamplingParams.from_openai({"max_tokens": 5}).max_new_tokens == 5
    assert SamplingParams.from_openai({}).max_new_tokens is None
    assert SamplingParams.from_openai({}, default_max_tokens=64).max_new_tokens == 64
    # null fields fall back to the defaults.
    p = SamplingParams.from_openai({"temperature": None, "top_p": None, "stop": None, "seed": None})
    assert (p.temperature, p.top_p, p.stop, p.seed) == (1.0, 1.0, None, None)
    assert SamplingParams.from_openai({"stop": []}).stop is None
    assert SamplingParams.from_openai({"stop": ["a", "b"]}).stop == ["a", "b"]


def test_from_openai_sglang_extras_and_response_format():
    p = SamplingParams.from_openai(
        {
            "top_k": 40,
            "min_p": 0.1,
            "repetition_penalty": 1.2,
            "min_tokens": 4,
            "ignore_eos": True,
            "regex": "x+",
        }
    )
    assert (p.top_k, p.min_p, p.repetition_penalty, p.min_new_tokens, p.ignore_eos, p.regex) == (
        40,
        0.1,
        1.2,
        4,
        True,
        "x+",
    )
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = SamplingParams.from_openai(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    assert json.loads(p.json_schema) == schema
    assert json.loads(
        SamplingParams.from_openai({"response_format": {"type": "json_object"}}).json_schema
    ) == {"type": "object"}
    assert SamplingParams.from_openai({"response_format": {"type": "text"}}).json_schema is None
    with pytest.raises(SamplingParamsError, match="response_format"):
        SamplingParams.from_openai({"response_format": {"type": "yaml"}})
