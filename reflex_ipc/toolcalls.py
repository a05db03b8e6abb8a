"""Tool calls: the format a chat template asks for, parsing it out of generated text, and
the grammar that forces a call (`tool_choice` "required" or a named function).

Formats (`FORMATS`), each as its model family writes calls (the templates are in
tests/data/chat_templates, one test per format renders a call with it and parses it back):

- `hermes` (Hermes 2/3, Qwen2.5, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks, any number; the text outside them is the content.
- `llama3` (Llama 3.1-3.3 and Llama 4 JSON tool calling): the whole reply is one JSON object
  `{"name": ..., "parameters": {...}}` (or "arguments"), optionally after `<|python_tag|>`
  (Llama 4: inside `<|python_start|>` ... `<|python_end|>`).
- `mistral` (Mistral Nemo, v3 tokenizers): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
- `mistral_args` (Mistral Small 3.2, Magistral, Devstral: v11+): `[TOOL_CALLS]name[ARGS]{...}`,
  repeated for parallel calls (`[CALL_ID]id` before `[ARGS]` is accepted).
- `qwen3_coder` (Qwen3-Coder, XML style): `<tool_call><function=NAME><parameter=P>value
  </parameter>...</function></tool_call>`; a value is JSON when the parameter's schema type is
  not a string, else the raw text.
- `deepseek_r1` (DeepSeek-R1, V3-0324): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
  <｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`.
- `deepseek_v3` (DeepSeek-V3.1 and later): the same markers, `NAME<｜tool▁sep｜>{...}` inside.
- `harmony` (gpt-oss): messages `... to=functions.NAME<|channel|>commentary json<|message|>{...}`
  (reflex_ipc/harmony.py); the content is the final channel's text. A forced call is one
  message to the function (the reply ends with `<|call|>`), after an optional analysis message.

`detect(template)` names the format from the template's source; `parse_tool_calls(text,
tools, fmt)` -> (content, calls) where calls is OpenAI's shape
([{"id", "type": "function", "function": {"name", "arguments": JSON text}}]) or None; with
fmt None every format is tried. A call that does not parse, or names a function not in
`tools`, is left in the content as text. `grammar(fmt, tools, choice, parallel, tok)` is the
Lark grammar (llguidance) whose every output parses into at least one call of the chosen
function(s), arguments valid under each function's `parameters` schema.

Pure Python with the json module only: imported when a request has `tools`.
"""

from __future__ import annotations

import json
import re
import uuid

FORMATS = ("hermes", "llama3", "mistral", "mistral_args", "qwen3_coder", "deepseek_r1", "deepseek_v3",
           "harmony")

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_PY_TAG = "<|python_tag|>"
_PY_START, _PY_END = "<|python_start|>", "<|python_end|>"  # Llama 4
_TC = "[TOOL_CALLS]"
_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL, _DS_SEP, _DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_DS_ITEM = re.compile(re.escape(_DS_CALL) + r"(.*?)" + re.escape(_DS_SEP) + r"(.*?)" + re.escape(_DS_CALL_END), re.S)
_DS_FENCE = re.compile(r"^\s*(\S+?)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*$", re.S)
_XML_FN = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def detect(template: str | None):
    """The tool-call format a chat template's source asks for, or None (unknown)."""
    if not isinstance(template, str):
        return None
    if "<|channel|>" in template and "<|message|>" in template:
        return "harmony"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if _TC in template:
        return "mistral_args" if "[ARGS]" in template else "mistral"
    if _DS_BEGIN in template:
        return "deepseek_r1" if "```json" in template else "deepseek_v3"
    if _PY_TAG in template or _PY_START in template or ('"parameters"' in template and "ipython" in template):
        return "llama3"
    return None


def _names_and_schemas(tools):
    """{name: parameters schema} of OpenAI function tools (a list of names is accepted too)."""
    out = {}
    for t in tools or ():
        if isinstance(t, str):
            out[t] = None
        elif isinstance(t, dict):
            fn = t.get("function") if isinstance(t.get("function"), dict) else t
            if isinstance(fn.get("name"), str):
                params = fn.get("parameters")
                out[fn["name"]] = params if isinstance(params, dict) else None
    return out


def new_id(fmt=None):
    """A call id: Mistral's templates want 9 alphanumerics, others take OpenAI's call_ ids."""
    h = uuid.uuid4().hex
    return h[:9] if fmt in ("mistral", "mistral_args") else f"call_{h[:24]}"


def _call(name, args, known, i, cid=None):
    """One call in OpenAI's shape, or None when it does not name a known function or its
    arguments are not a JSON object (a JSON text of one is accepted)."""
    if not isinstance(name, str) or (known and name not in known):
        return None
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        text = args if args.strip() else "{}"
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return {"id": cid if isinstance(cid, str) and cid else f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": text}}


def _json_obj(obj, known, i):
    if not isinstance(obj, dict):
        return None
    return _call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})), known, i, obj.get("id"))


def _xml_value(raw, schema):
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _xml_call(body, known, i):
    m = _XML_FN.search(body)
    if m is None:
        return None
    name = m.group(1).strip()
    schema = (known.get(name) or {}) if known else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    args = {p.group(1).strip(): _xml_value(p.group(2), props.get(p.group(1).strip()))
            for p in _XML_PARAM.finditer(m.group(2))}
    return _call(name, args, known, i)


def _parse_tagged(text, known):
    """Hermes JSON blocks and Qwen3-Coder XML blocks, both inside <tool_call>...</tool_call>."""
    calls, pieces, last = [], [], 0
    for m in _HERMES.finditer(text):
        body = m.group(1)
        if body.startswith("<function="):
            call = _xml_call(body, known, len(calls))
        else:
            try:
                call = _json_obj(json.loads(body), known, len(calls))
            except ValueError:
                call = None
        if call is None:
            continue
        calls.append(call)
        pieces.append(text[last:m.start()])
        last = m.end()
    if not calls:
        return None
    tail = text[last:]
    cut = tail.rfind("<tool_call>")  # a call cut off by max_tokens (never closed) is not content
    pieces.append(tail if cut < 0 or "</tool_call>" in tail[cut:] else tail[:cut])
    return "".join(pieces).strip(), calls


def _parse_llama3(text, known):
    body, think = text.strip(), ""
    if body.startswith("<think>") and "</think>" in body:  # a reasoning block first stays content
        end = body.index("</think>") + len("</think>")
        think, body = body[:end], body[end:].strip()
    for tag in (_PY_TAG, _PY_START):
        if body.startswith(tag):
            body = body[len(tag):].strip()
    if body.endswith(_PY_END):
        body = body[:-len(_PY_END)].strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if isinstance(obj, dict) and ("parameters" in obj or "arguments" in obj):
        call = _json_obj(obj, known, 0)
        if call is not None:
            return think, [call]
    return None


_DEC = json.JSONDecoder()


def _parse_mistral(text, known):
    at = text.find(_TC)
    if at < 0:
        return None
    content, rest = text[:at], text[at:]
    calls = []
    while rest.startswith(_TC):
        rest = rest[len(_TC):].lstrip()
        if rest.startswith("["):  # v3: a JSON array of {"name", "arguments", "id"?}
            try:
                arr, end = _DEC.raw_decode(rest)
            except ValueError:
                return None
            if not isinstance(arr, list) or not arr:
                return None
            for obj in arr:
                call = _json_obj(obj, known, len(calls))
                if call is None:
                    return None
                calls.append(call)
            rest = rest[end:].lstrip()
            continue
        a = rest.find("[ARGS]")  # v11: NAME([CALL_ID]id)?[ARGS]{...}
        if a < 0:
            return None
        head, rest = rest[:a], rest[a + len("[ARGS]"):]
        name, _, cid = head.partition("[CALL_ID]")
        try:
            args, end = _DEC.raw_decode(rest)
        except ValueError:
            return None
        call = _call(name.strip(), args, known, len(calls), cid.strip() or None)
        if call is None:
            return None
        calls.append(call)
        rest = rest[end:].lstrip()
    if rest.strip() or not calls:
        return None
    return content.strip(), calls


def _parse_deepseek(text, known):
    at = text.find(_DS_BEGIN)
    if at < 0:
        return None
    end = text.find(_DS_END, at)
    body = text[at + len(_DS_BEGIN):end if end >= 0 else len(text)]
    after = text[end + len(_DS_END):] if end >= 0 else ""
    calls = []
    for m in _DS_ITEM.finditer(body):
        head, tail = m.group(1).strip(), m.group(2)
        f = _DS_FENCE.match(tail)
        if head == "function" and f is not None:  # R1: type, sep, name, a fenced JSON block
            call = _call(f.group(1), f.group(2), known, len(calls))
        else:  # V3.1: name, sep, JSON
            call = _call(head, tail.strip(), known, len(calls))
        if call is None:
            return None
        calls.append(call)
    if not calls:
        return None
    return (text[:at] + after).strip(), calls


def _parse_harmony(text, known):
    if "<|message|>" not in text:
        return None
    from .harmony import tool_calls

    content, found = tool_calls(text, known.keys() if known else ())
    calls = [c for c in (_call(n, a, known, i) for i, (n, a) in enumerate(found)) if c is not None]
    return (content, calls) if calls else None


_PARSERS = {"hermes": _parse_tagged, "qwen3_coder": _parse_tagged, "llama3": _parse_llama3,
            "mistral": _parse_mistral, "mistral_args": _parse_mistral,
            "deepseek_r1": _parse_deepseek, "deepseek_v3": _parse_deepseek, "harmony": _parse_harmony}
_ORDER = (_parse_harmony, _parse_tagged, _parse_mistral, _parse_deepseek, _parse_llama3)


def parse_tool_calls(text: str, tools=(), fmt=None):
    """(content, calls): the calls in `text` in format `fmt` (None: any format), OpenAI's
    shape, or (text, None) when there are none. `tools`: OpenAI function tools or names
    (empty: any name is accepted)."""
    known = _names_and_schemas(tools)
    parsers = [_PARSERS[fmt]] if fmt in _PARSERS else _ORDER
    for parse in parsers:
        got = parse(text, known)
        if got is not None:
            content, calls = got
            if fmt in ("mistral", "mistral_args"):
                for c in calls:  # Mistral's templates refuse ids that are not 9 alphanumerics
                    if not re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]):
                        c["id"] = new_id(fmt)
            return content, calls
    return text, None


# -- the grammar of a forced call ------------------------------------------------------------

def _lit(s):
    return json.dumps(s, ensure_ascii=False)


def _marker(tok, text):
    """`text` in a Lark rule: the special token `<[id]>` when the vocabulary has it as one
    special token (llguidance never produces special tokens from a string), else a literal."""
    if tok is not None:
        i = tok.find_text(text)
        if i >= 0:
            if _is_special(tok, i):
                return f"<[{i}]>"
    return _lit(text)


def _is_special(tok, i):
    """As constrain.token_table marks them: control tokens, and user-defined ones spelled <...>."""
    from .tokenizer import A_CONTROL, A_USER_DEFINED

    a, t = tok.attr(i), tok.token_text(i)
    return bool(a & A_CONTROL or (a & A_USER_DEFINED and t.startswith("<") and t.endswith(">")))


# JSON as json.dumps writes it (what the templates render and the models were trained on)
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _closed(schema):
    """The arguments' schema, closed (additionalProperties false) unless it says otherwise:
    a forced call stops after the listed parameters instead of inventing more."""
    s = dict(schema) if isinstance(schema, dict) else {}
    if not s:
        return {"type": "object"}
    if isinstance(s.get("properties"), dict) and "additionalProperties" not in s:
        s["additionalProperties"] = False
    return s


def _schema_json(schema):
    s = dict(schema) if isinstance(schema, dict) else {"type": "object"}
    if not s:
        s = {"type": "object"}
    s["x-guidance"] = _JSON_STYLE
    return "%json " + json.dumps(s, ensure_ascii=False)


def _object_schema(props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _chosen(tools, choice):
    """[(name, parameters schema)] the grammar may call."""
    known = _names_and_schemas(tools)
    if isinstance(choice, dict):
        fn = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        name = fn.get("name")
        if name not in known:
            from .errors import ReflexError

            raise ReflexError("invalid_request", f"`tool_choice`: no tool named {name!r} in `tools`")
        return [(name, known[name])]
    return list(known.items())


def _xml_params(tok, schema):
    """The <parameter=...> lines of one Qwen3-Coder call: required ones in order, then each
    optional one optionally."""
    props = schema.get("properties") if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) else {}
    required = [p for p in (schema or {}).get("required", []) if p in props] if isinstance(schema, dict) else []
    parts = []
    for p, ps in props.items():
        kind = ps.get("type") if isinstance(ps, dict) else None
        head = _lit(f"<parameter={p}>\n")
        enum = ps.get("enum") if isinstance(ps, dict) else None
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            value = "(" + " | ".join(_lit(v) for v in enum) + ') "\\n"'
        elif (kind == "string" or kind is None) and ("maxLength" in ps or "minLength" in ps):
            lo, hi = int(ps.get("minLength", 0)), ps.get("maxLength")
            value = f"/[^<]{{{lo},{'' if hi is None else int(hi)}}}\\n/"  # the text, then its newline
        elif kind == "string" or kind is None:
            value = "XML_TEXT"
        else:
            value = _schema_json(ps) + ' "\\n"'
        part = f"{head} {value} " + _lit("</parameter>\n")
        parts.append(part if p in required else f"({part})?")
    return " ".join(parts)


def grammar(fmt, tools, choice="required", parallel=True, tok=None, think=False) -> str:
    """The Lark grammar (llguidance) that forces one call (several when `parallel`) in
    format `fmt` (None: hermes) to one of `tools` (`choice` "required") or to the function
    `choice` names ({"type": "function", "function": {"name"}}). `think`: a reasoning block
    (`<think>...</think>`, as Qwen3 writes it) may come first."""
    g = _grammar(fmt or "hermes", tools, choice, parallel, tok)
    if not think or fmt == "harmony":  # gpt-oss reasons in its analysis channel (in the grammar)
        return g
    g = g.replace("start: ", "calls: ", 1)
    open_, close = _marker(tok, "<think>"), _marker(tok, "</think>")
    if open_.startswith("<[") and close.startswith("<["):  # special tokens end the text themselves
        think_rule = f"think: {open_} THINK_TEXT {close} WS\nTHINK_TEXT: /(.|\\n)*/\n"
    else:  # text tags: the block is one lazy lexeme, ending at the first </think>
        think_rule = "think: think_block WS\nthink_block[lazy]: /<think>(.|\\n)*<\\/think>/\n"
    return f"start: think? calls\n{think_rule}WS: /[ \\t\\n]*/\n" + g


def _grammar(fmt, tools, choice, parallel, tok) -> str:
    funcs = _chosen(tools, choice)
    rules = []
    if fmt == "qwen3_coder":
        alts = []
        for k, (name, schema) in enumerate(funcs):
            rules.append(f"f{k}: " + _lit(f"<function={name}>\n") + f" {_xml_params(tok, schema)} "
                         + _lit("</function>"))
            alts.append(f"f{k}")
        rules.append("XML_TEXT: /[^<]*/")
        call = f"{_marker(tok, '<tool_call>')} \"\\n\" ({' | '.join(alts)}) \"\\n\" {_marker(tok, '</tool_call>')}"
        rules.insert(0, f"call: {call}")
        sep = '"\\n"'
    elif fmt in ("hermes", "llama3", "mistral"):
        args_key = "parameters" if fmt == "llama3" else "arguments"
        objs = [_object_schema({"name": {"const": name}, args_key: _closed(schema)})
                for name, schema in funcs]
        if fmt == "mistral":  # Nemo writes a 9-character id after the arguments
            for o in objs:
                o["properties"]["id"] = {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}
        one = objs[0] if len(objs) == 1 else {"anyOf": objs}
        if fmt == "mistral":
            arr = {"type": "array", "items": one, "minItems": 1}
            if not parallel:
                arr["maxItems"] = 1
            return f"start: {_marker(tok, _TC)} {_schema_json(arr)}\n"
        if fmt == "llama3":  # one JSON object is the whole reply: no parallel calls
            return f"start: {_schema_json(one)}\n"
        rules.append(f"call: {_marker(tok, '<tool_call>')} \"\\n\" {_schema_json(one)} \"\\n\" "
                     f"{_marker(tok, '</tool_call>')}")
        sep = '"\\n"'
    elif fmt == "mistral_args":
        alts = []
        for k, (name, schema) in enumerate(funcs):
            rules.append(f"f{k}: {_lit(name)} call_id? {_marker(tok, '[ARGS]')} {_schema_json(_closed(schema))}")
            alts.append(f"f{k}")
        rules.insert(0, f"call: {_marker(tok, _TC)} ({' | '.join(alts)})")
        rules.append(f"call_id: {_marker(tok, '[CALL_ID]')} CALL_ID\nCALL_ID: /[A-Za-z0-9]{{9}}/")
        sep = None
    elif fmt in ("deepseek_r1", "deepseek_v3"):
        alts = []
        for k, (name, schema) in enumerate(funcs):
            if fmt == "deepseek_r1":
                body = (f'"function" {_marker(tok, _DS_SEP)} {_lit(name + chr(10) + "```json" + chr(10))} '
                        f'{_schema_json(_closed(schema))} {_lit(chr(10) + "```")}')
            else:
                body = f"{_lit(name)} {_marker(tok, _DS_SEP)} {_schema_json(_closed(schema))}"
            rules.append(f"f{k}: {_marker(tok, _DS_CALL)} {body} {_marker(tok, _DS_CALL_END)}")
            alts.append(f"f{k}")
        rules.insert(0, f"call: {' | '.join(alts)}")
        between = '"\\n" ' if fmt == "deepseek_r1" else ""
        more = f" ({between}call)*" if parallel else ""
        return "\n".join([f"start: {_marker(tok, _DS_BEGIN)} call{more} {_marker(tok, _DS_END)}", *rules]) + "\n"
    elif fmt == "harmony":  # one call ends the reply (<|call|>); an analysis message may come first
        ch, msg = _marker(tok, "<|channel|>"), _marker(tok, "<|message|>")
        alts = []
        for k, (name, schema) in enumerate(funcs):
            rules.append(f"f{k}: {ch} {_lit('commentary to=functions.' + name + ' ')} {_marker(tok, '<|constrain|>')} "
                         f"\"json\" {msg} {_schema_json(_closed(schema))}")
            alts.append(f"f{k}")
        rules.append(f"analysis: {ch} \"analysis\" {msg} ANALYSIS {_marker(tok, '<|end|>')} "
                     f"{_marker(tok, '<|start|>')} \"assistant\"\nANALYSIS: /[^<]*/")
        return "\n".join([f"start: analysis? ({' | '.join(alts)})", *rules]) + "\n"
    else:
        from .errors import ReflexError

        raise ReflexError("invalid_request", f"unknown tool-call format {fmt!r}")
    if parallel:
        start = f"start: call ({sep + ' ' if sep else ''}call)*"
    else:
        start = "start: call"
    return "\n".join([start, *rules]) + "\n"


# -- conversation history --------------------------------------------------------------------

def object_arguments(messages):
    """The messages with each assistant tool call's `arguments` as an object (when it is the
    JSON text of one): most templates write `arguments | tojson` or iterate its items, so a
    JSON string (OpenAI's shape) would come out quoted or fail."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list) and any(isinstance(c, dict) and isinstance(
                (c.get("function") or {}).get("arguments") if isinstance(c.get("function"), dict) else None, str)
                for c in calls):
            m = dict(m)
            new = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        obj = json.loads(fn["arguments"])
                    except ValueError:
                        obj = None
                    if isinstance(obj, dict):
                        c = {**c, "function": {**fn, "arguments": obj}}
                new.append(c)
            m["tool_calls"] = new
        out.append(m)
    return out


def wants_object_arguments(template: str | None) -> bool:
    """True when the template writes a call's arguments through tojson or iterates their
    items (Llama 3, Mistral, Qwen3-Coder, DeepSeek, Qwen3 too): OpenAI's JSON text is then
    given to it as the object it holds (llama.cpp does the same)."""
    if not isinstance(template, str):
        return False
    return bool(re.search(r"arguments['\"\]]*\s*\|\s*(tojson|items)|function['\"\]]*\s*\|\s*tojson|"
                          r"arguments is (string|mapping)", template))
