"""protocol/PROTOCOL.md against the server: every JSON example in it, and every op's
parameter list.

* each request example is sent, in document order, to one real `reflex stdio` on the
  default model and must succeed; each response example and each real response
  validates against protocol/schema.json;
* an op's example result has exactly the keys the real result has (load: the
  example's keys are a subset, as the document says the engine may add keys);
* every op has a request and a result example, and its section lists exactly the
  fields of its Request struct (reflex_ipc/ops/<op>.py).

SmolLM2 has no fill-in-the-middle tokens: infill's examples run on a second server
whose default model is a synthetic one with Qwen2.5-Coder's FIM tokens.
"""

import json
import os
import pathlib
import re
import select
import subprocess
import time

import jsonschema
import msgspec
import pytest

from reflex_ipc.ops import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = (ROOT / "protocol" / "PROTOCOL.md").read_text(encoding="utf-8")
SCHEMA = json.loads((ROOT / "protocol" / "schema.json").read_text(encoding="utf-8"))


def validate(obj, ref):
    sub = {"$ref": f"#/$defs/{ref}", "$defs": SCHEMA["$defs"]}
    jsonschema.Draft202012Validator(sub).validate(obj)


def json_blocks():
    """[[object, ...] per ```json block], in document order."""
    out = []
    for m in re.finditer(r"```json\n(.*?)```", DOC, re.S):
        text, objs, dec, i = m.group(1), [], json.JSONDecoder(), 0
        while True:
            while i < len(text) and text[i].isspace():
                i += 1
            if i >= len(text):
                break
            obj, i = dec.raw_decode(text, i)
            objs.append(obj)
        out.append(objs)
    return out


BLOCKS = json_blocks()
EXAMPLES = [o for b in BLOCKS for o in b]
REQUESTS = [o for o in EXAMPLES if "event" not in o]
RESPONSES = [o for o in EXAMPLES if "event" in o]


def test_examples_are_there():
    assert len(BLOCKS) >= 12 and all(BLOCKS)
    ops = set(registry())
    assert {r["op"] for r in REQUESTS} == ops
    assert {r["op"] for r in RESPONSES if r["event"] == "result" and r["ok"]} == ops


@pytest.mark.parametrize("obj", RESPONSES, ids=lambda o: f"{o['event']}:{o.get('op')}")
def test_response_examples_validate(obj):
    validate(obj, "response")


@pytest.mark.parametrize("obj", REQUESTS, ids=lambda o: o["op"])
def test_request_examples_validate(obj):
    validate(obj, "request")


def sections():
    """{op: the text of its '### op' section}."""
    out = {}
    parts = re.split(r"^### (\w+)\n", DOC.split("## Ops\n", 1)[1].split("\n## ", 1)[0], flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2]):
        out[name] = body
    return out


def listed_params(body):
    """The backticked names that open the section's top-level bullets."""
    names = set()
    for line in body.splitlines():
        if line.startswith("* `"):
            head = re.split(r"[(:]", line[2:], maxsplit=1)[0]
            names |= set(re.findall(r"`(\w+)`", head))
    return names


@pytest.mark.parametrize("op", list(registry()))
def test_each_op_section_lists_its_struct_fields(op):
    body = sections()[op]
    fields = {f.name for f in msgspec.structs.fields(registry()[op].Request)}
    assert listed_params(body) == fields, op


class Server:
    def __init__(self, model=None):
        env = dict(os.environ)
        env.pop("REFLEX_MODEL", None)
        self.p = subprocess.Popen(["reflex", "stdio", "--device", "cpu",
                                   *(["--model", model] if model else [])],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.buf = b""
        self.ready = self.line()

    def line(self, timeout=300):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            assert left > 0, "no answer from reflex stdio"
            if select.select([self.p.stdout], [], [], left)[0]:
                data = os.read(self.p.stdout.fileno(), 1 << 16)
                assert data, "reflex stdio closed its stdout"
                self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, obj):
        self.p.stdin.write(json.dumps(obj).encode() + b"\n")
        self.p.stdin.flush()
        lines = [self.line()]
        while lines[-1]["event"] != "result":
            lines.append(self.line())
        return lines


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory, smollm2):
    from reflex_ipc.testing import vocab as vg
    from reflex_ipc.testing.synthetic import parity_model

    d = tmp_path_factory.mktemp("fimmodel")
    vocab = str(d / "vocab.gguf")
    vg.vocab_gguf(vocab, vg.FIM_QWEN)
    return parity_model("llama", str(d / "fim-llama.gguf"), vocab_paths={"gpt2": vocab})


def test_examples_against_the_server(smollm2, fim_model):
    """The default model (SmolLM2: the `smollm2` fixture skips, in CI fails, without it);
    infill on a model with FIM tokens."""
    srv = Server()
    fim = None
    try:
        validate(srv.ready, "response")
        shutdown = None
        for block in BLOCKS:
            reqs = [o for o in block if "event" not in o]
            if not reqs:
                continue
            (req,) = reqs
            example = [o for o in block if o.get("event") == "result"]
            if req["op"] == "shutdown":
                shutdown = (req, example)
                continue
            if req["op"] == "infill":
                fim = fim or Server(fim_model)
                lines = fim.request(req)
            else:
                lines = srv.request(req)
            res = lines[-1]
            assert res["ok"], (req, res)
            for line in lines:
                validate(line, "response")
            if req.get("stream"):
                assert [x["event"] for x in lines[:-1]] and all(
                    x["event"] == "token" for x in lines[:-1])
            for ex in example:
                if req["op"] == "load":
                    assert set(ex) <= set(res), (req["op"], set(ex) - set(res))
                else:
                    assert set(ex) == set(res), (req["op"], set(ex) ^ set(res))
        assert shutdown, "PROTOCOL.md has no shutdown example"
        req, example = shutdown
        (res,) = srv.request(req)
        assert res["ok"] and set(res) == set(example[0])
        assert srv.p.wait(timeout=60) == 0
    finally:
        for s in (srv, fim):
            if s is not None and s.p.poll() is None:
                s.p.kill()
                s.p.wait()


def test_error_kinds_listed_as_the_server_has_them():
    """hello's example lists every kind the server returns, in its order (errors.KINDS), and
    the Errors table has a row for each."""
    from reflex_ipc.errors import KINDS

    hello = next(o for o in RESPONSES if o.get("op") == "hello" and o["event"] == "result")
    assert hello["error_kinds"] == list(KINDS)
    table = DOC.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(KINDS)


def test_examples_show_the_default_backend():
    """The examples run on the default device (auto: the C kernels on a machine without
    CUDA), so their `backend` is cpu, as a newcomer sees it."""
    backends = {o["backend"] for o in RESPONSES if o.get("backend")}
    backends |= {m["backend"] for o in RESPONSES for m in o.get("models") or []}
    assert backends == {"cpu"}
