"""Issue 18 item 10: a JSON-schema keyword xgrammar does not enforce is refused by name.

For every refused case the probe shows why: the jsonschema validator (the reference) rejects an
instance that xgrammar's compiled grammar accepts. For the keywords we keep, the grammar rejects
that instance too. A newer xgrammar that starts enforcing a refused keyword fails the probe here."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as grammar_accepts

from sgl_inkling.constrained import validate
from sgl_inkling.constrained.spec import GrammarError

OBJ_AB = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}

REFUSED = {  # keyword named in the error: (schema, instance the schema forbids)
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
    "not": ({"type": "integer", "not": {"const": 3}}, 3),
    "if": ({**OBJ_AB, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, {"a": 1}),
    "dependentRequired": ({**OBJ_AB, "dependentRequired": {"a": ["b"]}}, {"a": 1}),
    "dependentSchemas": ({**OBJ_AB, "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1}),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}}, [1]),
    "allOf": ({"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 5}]}, 9),
    "multipleOf": ({"type": "number", "multipleOf": 0.5}, 0.3),
    "minimum": ({"anyOf": [{"type": "integer"}, {"type": "null"}], "minimum": 5}, 1),  # beside anyOf
}

KEPT = {
    "integer multipleOf": ({"type": "integer", "multipleOf": 3}, 4),
    "single allOf": ({"$defs": {"x": {"type": "integer"}}, "allOf": [{"$ref": "#/$defs/x"}]}, "s"),
    "annotated anyOf": ({"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "T"}, 3),
    "bounds": ({"type": "integer", "minimum": 3, "maximum": 9}, 1),
    "required": ({**OBJ_AB, "required": ["a"]}, {}),
    "maxItems": ({"type": "array", "maxItems": 1}, [1, 2]),
}


def _xgrammar_accepts(schema, instance) -> bool:
    return grammar_accepts(xgr.Grammar.from_json_schema(json.dumps(schema)), json.dumps(instance))


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_unenforced_keywords_are_refused_by_name(keyword):
    schema, instance = REFUSED[keyword]
    assert not jsonschema.Draft202012Validator(schema).is_valid(instance)
    assert _xgrammar_accepts(schema, instance), f"xgrammar now enforces {keyword}: accept it again"
    with pytest.raises(GrammarError, match=f"'{keyword}'"):
        validate.json_schema(schema)


def test_refusal_names_where_in_a_nested_schema():
    schema = {"type": "object", "properties": {"tags": REFUSED["uniqueItems"][0]}}
    with pytest.raises(GrammarError, match="'uniqueItems' at /properties/tags"):
        validate.json_schema(json.dumps(schema))
    with pytest.raises(GrammarError, match="'not'"):
        validate.tool_parameters("f", {"type": "object", "properties": {"x": REFUSED["not"][0]}})


@pytest.mark.parametrize("case", sorted(KEPT))
def test_enforced_keywords_are_kept(case):
    schema, instance = KEPT[case]
    assert not jsonschema.Draft202012Validator(schema).is_valid(instance)
    assert not _xgrammar_accepts(schema, instance)
    assert validate.json_schema(schema) == schema


def test_deeply_nested_schema_text_is_a_grammar_error():
    deep = '{"items": ' * 5000 + "{}" + "}" * 5000
    with pytest.raises(GrammarError):
        validate.json_schema(deep)
