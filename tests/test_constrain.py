"""Constrained decoding (reflex_ipc/constrain.py, llguidance) on SmolLM2's vocabulary.

A decoder stand-in draws random logits (several seeds, greedy under the mask), so
every path through a grammar is exercised without a model: each output under a
JSON Schema must parse and validate (jsonschema), each regex output must
fullmatch, each Lark output must be in the language. Bad constraints are
invalid_request naming the field.
"""

import json
import re

import jsonschema
import numpy as np
import pytest

from reflex_ipc import constrain
from reflex_ipc.errors import ReflexError
from reflex_ipc.gguffile import GGUFFile
from reflex_ipc.modelpath import resolve_model
from reflex_ipc.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("smollm2")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(GGUFFile(resolve_model("smollm2")))


def run(tok, c, seed, max_tokens=300, temperature=3.0):
    """Sample under the constraint from random logits; returns the text."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(max_tokens):
        mask = c.allowed()
        assert mask is None or (mask.dtype == bool and mask.shape == (tok.n_vocab,))
        logits = rng.standard_normal(tok.n_vocab) * temperature
        # stand-in for a model that prefers to stop eventually
        logits[list(tok.eog_ids)] += len(out) / 20
        if mask is not None:
            assert mask.any()
            logits[~mask] = -np.inf
        tid = int(np.argmax(logits))
        c.commit(tid)
        if tid in tok.eog_ids:
            break
        out.append(tid)
        if c.done():
            break
    else:
        pytest.fail(f"no end after {max_tokens} tokens: {tok.decode(out)!r}")
    return tok.decode(out)


SCHEMAS = [
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
     "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1,
                 "maxItems": 3}},
     "required": ["name", "age", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer"}, "email": {"type": "string", "pattern": "^[a-z]{1,6}@[a-z]{1,6}\\.com$"},
            "roles": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]},
                      "minItems": 0, "maxItems": 2}},
            "required": ["id", "email", "roles"], "additionalProperties": False},
        "active": {"type": "boolean"}, "score": {"type": "number", "minimum": -1, "maximum": 1}},
     "required": ["user", "active", "score"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2,
     "maxItems": 4},
    {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 2, "maxLength": 4}]},
    {"type": "object", "properties": {"point": {"$ref": "#/$defs/pt"}, "path": {
        "type": "array", "items": {"$ref": "#/$defs/pt"}, "maxItems": 2}},
     "required": ["point", "path"], "additionalProperties": False,
     "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                      "required": ["x", "y"], "additionalProperties": False}}},
    {"enum": ["red", "green", 3, None]},
    {"type": "object", "properties": {"q": {"const": "fixed"}, "n": {"type": "integer",
                                                                     "exclusiveMinimum": 10,
                                                                     "exclusiveMaximum": 13}},
     "required": ["q", "n"], "additionalProperties": False},
]


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_outputs_validate(tok, i):
    schema = SCHEMAS[i]
    for seed in range(4):
        c = constrain.make_constraint(tok, json_schema=schema)
        text = run(tok, c, seed)
        obj = json.loads(text)
        jsonschema.validate(obj, schema)


@pytest.mark.parametrize("pattern", [r"(yes|no)", r"[0-9]{3}-[0-9]{4}", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)",
                                     r"#[0-9a-f]{6}"])
def test_regex_outputs_match(tok, pattern):
    for seed in range(4):
        text = run(tok, constrain.make_constraint(tok, regex=pattern), seed)
        assert re.fullmatch(pattern, text), text


def test_lark_grammar(tok):
    g = 'start: expr\nexpr: NUM | "(" expr OP expr ")"\nOP: "+" | "*"\nNUM: /[0-9]/'
    for seed in range(4):
        text = run(tok, constrain.make_constraint(tok, grammar=g), seed)
        assert re.fullmatch(r"[0-9()+*]+", text) and text.count("(") == text.count(")")
        assert eval(text) is not None  # noqa: S307 (digits, + * and parentheses only)


def test_done_ends_generation(tok):
    c = constrain.make_constraint(tok, regex="ab")
    for t in tok.encode("ab", add_bos=False, parse_special=False):
        assert c.allowed()[t]
        c.commit(t)
    assert c.done()


def test_mask_matches_llguidance_bitmask(tok):
    """The bool mask is llguidance's bitmask, bit for bit (plus the EOG ids once it
    may stop)."""
    import llguidance

    c = constrain.make_constraint(tok, regex="[0-9]+")
    raw = np.frombuffer(c.m.compute_bitmask(), dtype=np.uint32)
    mask = c.allowed()
    want = np.array([(raw[i // 32] >> (i % 32)) & 1 for i in range(tok.n_vocab)], dtype=bool)
    assert np.array_equal(mask, want)
    assert not mask[tok.encode("a", add_bos=False)[0]]
    assert llguidance is not None


@pytest.mark.parametrize("kw, field, words", [
    ({"regex": "(ab"}, "regex", "unclosed"),
    ({"regex": 3}, "regex", "string"),
    ({"grammar": "start: foo"}, "grammar", "foo"),
    ({"grammar": ""}, "grammar", "Lark"),
    ({"json_schema": {"type": "foo"}}, "json_schema", "valid JSON Schema"),
    ({"json_schema": "not a schema"}, "json_schema", "object"),
    ({"json_schema": {"type": "string", "format": "no-such-format"}}, "json_schema", "format"),
    ({"json_schema": {"$ref": "http://example.com/s.json"}}, "json_schema", "example.com"),
    ({"regex": "a", "grammar": "start: \"a\""}, "json_schema", "at most one"),
])
def test_bad_constraints(tok, kw, field, words):
    with pytest.raises(ReflexError) as e:
        constrain.make_constraint(tok, **kw)
    assert e.value.kind == "invalid_request"
    assert words in e.value.message
    if "at most one" not in words:
        assert e.value.message.startswith(f"`{field}`")


def test_unsupported_feature_named(tok):
    """A schema keyword llguidance does not implement is named in the message."""
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(ReflexError) as e:
        constrain.make_constraint(tok, json_schema=schema)
    assert e.value.kind == "invalid_request" and "uniqueItems" in e.value.message


def test_none_when_no_field(tok):
    assert constrain.make_constraint(tok) is None


def test_lltokenizer_built_once(tok):
    assert constrain.lltokenizer(tok) is constrain.lltokenizer(tok)
