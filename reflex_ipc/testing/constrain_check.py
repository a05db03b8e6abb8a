"""Constrained output end to end on whatever llguidance is importable (issue 32 item 19):
run in a subprocess whose PYTHONPATH puts another llguidance version first, so the
suite checks the lowest version the `constrain` extra allows, not only the installed one.

    python -m reflex_ipc.testing.constrain_check [GGUF]     (default: smollm2)

Prints one JSON object {"llguidance": version, "failures": [...], "checks": n}; exit
status 0 when every check passed. The checks: outputs under JSON Schemas parse and
validate, regex outputs fullmatch, a Lark grammar's outputs are in its language (random
logits, greedy under the mask, several seeds), every end-of-generation id is allowed once
the output may end, and constraints nothing satisfies or past llguidance's limits are one
ReflexError of a stable kind.
"""

import json
import re
import sys

SCHEMAS = [
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
     "required": ["answer"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                               "maxItems": 3}},
     "required": ["n", "tags"], "additionalProperties": False},
]
REGEXES = [r"[a-z]{1,6}", r"(yes|no)", r"\d{3}-\d{4}"]
GRAMMAR = 'start: "(" item ("," item)* ")"\nitem: "a" | "b"'
REFUSED = [({"regex": "[^\\x00-\\U0010FFFF]"}, "invalid_request"),
           ({"regex": "\\"}, "invalid_request"),
           ({"grammar": "start: x\nx: x"}, "invalid_request"),
           ({"json_schema": {"$ref": "#"}}, "invalid_request"),
           ({"json_schema": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}, "invalid_request")]


def sample(tok, c, seed, max_tokens=200):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(max_tokens):
        mask = c.allowed()
        logits = rng.standard_normal(tok.n_vocab) * 3.0
        logits[list(tok.eog_ids)] += len(out) / 10
        if mask is not None:
            if not mask.any():
                raise AssertionError("an empty mask")
            logits[~mask] = -np.inf
        tid = int(np.argmax(logits))
        c.commit(tid)
        if tid in tok.eog_ids:
            break
        out.append(tid)
        if c.done():
            break
    return tok.decode(out)


def run(path=None):
    import llguidance

    from reflex_ipc.constrain import make_constraint
    from reflex_ipc.errors import ReflexError
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.modelpath import resolve_model
    from reflex_ipc.tokenizer import load_tokenizer

    version = getattr(llguidance, "__version__", None)
    if version is None:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        try:
            version = dist_version("llguidance")
        except PackageNotFoundError:
            version = "?"
    tok = load_tokenizer(GGUFFile(resolve_model(path or "smollm2")))
    failures, n = [], 0

    def check(ok, what):
        nonlocal n
        n += 1
        if not ok:
            failures.append(what)

    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    for i, schema in enumerate(SCHEMAS):
        for seed in range(3):
            try:
                text = sample(tok, make_constraint(tok, json_schema=schema), seed)
                obj = json.loads(text)
                if jsonschema is not None:
                    jsonschema.validate(obj, schema)
                check(True, "")
            except Exception as e:  # noqa: BLE001  (every failure is reported)
                check(False, f"schema {i} seed {seed}: {type(e).__name__}: {str(e)[:200]}")
    for pat in REGEXES:
        for seed in range(3):
            try:
                text = sample(tok, make_constraint(tok, regex=pat), seed)
                check(re.fullmatch(pat, text) is not None, f"regex {pat!r}: {text!r}")
            except Exception as e:  # noqa: BLE001
                check(False, f"regex {pat!r}: {type(e).__name__}: {str(e)[:200]}")
    lang = re.compile(r"\([ab](,[ab])*\)")
    for seed in range(3):
        try:
            text = sample(tok, make_constraint(tok, grammar=GRAMMAR), seed)
            check(lang.fullmatch(text) is not None, f"grammar: {text!r}")
        except Exception as e:  # noqa: BLE001
            check(False, f"grammar: {type(e).__name__}: {str(e)[:200]}")
    try:  # every end-of-generation id is allowed once the output may end
        c = make_constraint(tok, regex="a?")
        mask = c.allowed()
        check(all(mask[i] for i in tok.eog_ids), f"eog ids not all allowed at an accepting state")
    except Exception as e:  # noqa: BLE001
        check(False, f"eog: {type(e).__name__}: {e}")
    for kw, kind in REFUSED:
        try:
            make_constraint(tok, **kw)
            check(False, f"{kw}: accepted")
        except ReflexError as e:
            check(e.kind == kind, f"{kw}: {e.kind}: {e.message[:200]}")
        except BaseException as e:  # noqa: BLE001  (a panic is a BaseException)
            check(False, f"{kw}: {type(e).__name__}: {str(e)[:200]}")
    return {"llguidance": version, "llguidance_file": llguidance.__file__, "checks": n,
            "failures": failures}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    res = run(argv[0] if argv else None)
    print(json.dumps(res))
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
