"""Command-line options from an op's Request struct (reflex_ipc/ops).

The model commands (generate, system1, embed, tokenize) take the protocol's
parameters as options: `add_options` derives them from the struct's fields (the
type, the choices, the default shown in --help, the description), and
`request` checks the given values with the same struct, before any model is
loaded, so the command line and the protocol accept exactly the same values.
"""

import sys
import typing

from ..errors import ReflexError

PROMPT_HELP = "the text; '-' or none: read it from stdin (one trailing newline dropped)"


def _range(m) -> str:
    """A Meta's bounds as text ("1 <= n <= 131072"), "" when it has none."""
    lo = f"{m.ge} <= " if m.ge is not None else f"{m.gt} < " if m.gt is not None else ""
    hi = f" <= {m.le}" if m.le is not None else f" < {m.lt}" if m.lt is not None else ""
    if hi.endswith(str(2**63 - 1)):
        hi = ""
    return f"{lo}n{hi}" if lo or hi else ""


def _unwrap(tp):
    """(base type, description) of an annotation: Optional/Annotated peeled off; the
    description is the Meta's, with its bounds."""
    desc = None
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp, *metas = typing.get_args(tp)
            for m in metas:
                d = getattr(m, "description", None)
                if hasattr(m, "ge") and _range(m):
                    d = f"{d}; {_range(m)}" if d else _range(m)
                desc = desc or d
        elif origin is typing.Union:
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            lists = [a for a in args if typing.get_origin(_unwrap(a)[0]) is list]
            tp = lists[0] if lists else args[0]  # str | list[str]: the list (repeatable)
        else:
            return tp, desc


def _default(f):
    import msgspec

    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return msgspec.NODEFAULT


# The sections of a model command's --help, in this order (the usage line follows it too).
SECTIONS = ("input", "model", "sampling", "constraints", "saved state", "output")
# an op field -> its section; a field not named here (a new one) goes to "sampling" when it
# is a decoding parameter of a generate-like op, else to the parser's own "options"
FIELD_SECTION = {
    "candidates": "input", "add_bos": "input", "parse_special": "input", "special": "input",
    "model": "model", "device": "model",
    "max_tokens": "sampling", "temperature": "sampling", "top_k": "sampling", "top_p": "sampling",
    "min_p": "sampling", "seed": "sampling", "repeat_penalty": "sampling",
    "repeat_last_n": "sampling", "stop": "sampling",
    "regex": "constraints", "json_schema": "constraints", "grammar": "constraints",
    "kv_import": "saved state", "kv_export": "saved state",
    "logprobs": "output", "normalize": "output", "pooling": "output",
}
# what an option's value is, in --help ("--import-kv FILE", not "--import-kv KV_IMPORT")
METAVARS = {
    "model": "MODEL", "kv_import": "FILE", "kv_export": "FILE", "candidates": "TEXT",
    "stop": "TEXT", "regex": "REGEX", "max_tokens": "N", "seed": "N", "logprobs": "N",
    "top_k": "K", "repeat_last_n": "N", "temperature": "T", "top_p": "P", "min_p": "P",
    "repeat_penalty": "X",
}


def _metavar(field, tp) -> str:
    if field in METAVARS:
        return METAVARS[field]
    return "N" if tp is int else "X" if tp is float else field.rsplit("_", 1)[-1].upper()


class Layout:
    """A command's options, collected into --help sections (SECTIONS order) and added to
    the parser in that order by done(), so the usage line reads in the same order."""

    def __init__(self, parser, sections=SECTIONS):
        self.parser = parser
        self.order = list(sections)
        self.groups = {}
        self.pending = []

    def add(self, section, *names, **kw):
        if section not in self.order:
            self.order.append(section)
        self.pending.append((self.order.index(section), len(self.pending), names, kw))

    def done(self):
        for idx, _, names, kw in sorted(self.pending, key=lambda e: e[:2]):
            title = self.order[idx]
            if title not in self.groups:
                self.groups[title] = (self.parser if title == "options"
                                      else self.parser.add_argument_group(title))
            self.groups[title].add_argument(*names, **kw)
        self.pending = []
        return self.parser


def add_options(layout, cls, *, skip=(), flags=None, helps=None, sections=None):
    """One option per field of `cls` (besides `skip`): --field-name, or flags[field]
    (a list of option strings), in its --help section (FIELD_SECTION, `sections`
    overriding). Options default to None (not given: the struct's default, which --help
    shows). `layout` is a Layout (a bare parser: one is made and finished here)."""
    import msgspec

    own = not isinstance(layout, Layout)
    if own:
        layout = Layout(layout)
    flags, helps, sections = flags or {}, helps or {}, {**FIELD_SECTION, **(sections or {})}
    for f in msgspec.structs.fields(cls):
        if f.name in skip:
            continue
        tp, desc = _unwrap(f.type)
        default = _default(f)
        names = flags.get(f.name) or [
            ("--no-" if tp is bool and default is True else "--") + f.name.replace("_", "-")]
        text = helps.get(f.name) or desc or ""
        kw = {"dest": f.name, "default": None}
        if tp is bool and default is None:  # three states: --x, --no-x, neither
            import argparse

            names = ["--" + f.name.replace("_", "-")]
            kw.update(action=argparse.BooleanOptionalAction)
            shown = None
        elif tp is bool:
            kw.update(action="store_const", const=not default)
            shown = None  # a switch: its help says what it does
        elif typing.get_origin(tp) is dict:  # KEY=VALUE, repeatable
            kw.update(action="append", type=str, metavar="KEY=VALUE")
            shown = None
        elif typing.get_origin(tp) is list:
            kw.update(action="append", type=str, metavar=_metavar(f.name, str))
            shown = "none" if default == [] else default
        elif typing.get_origin(tp) is typing.Literal:
            kw.update(choices=list(typing.get_args(tp)))
            shown = default
        else:
            kw.update(type=tp, metavar=_metavar(f.name, tp))
            shown = default
        if default is msgspec.NODEFAULT or "default:" in text:
            shown = None
        elif shown is not None:
            text = f"{text}{'; ' if text else ''}default: {shown}"
        elif default is None and tp is not bool:
            text = f"{text}{'; ' if text else ''}default: none"
        layout.add(sections.get(f.name, "options"), *names, help=text.replace("%", "%%"), **kw)
    if own:
        layout.done()
    return layout


def option_name(field: str, flags=None) -> str:
    return ((flags or {}).get(field) or ["--" + field.replace("_", "-")])[0]  # not for bools


def request(cls, args, given: dict = None, *, skip=(), flags=None, names=None):
    """The struct of the command line's values (those given; the rest default), checked
    with the protocol's rules. A bad value: ReflexError invalid_request naming the option
    (or, for a field in `given`, names[field], else the field's name in capitals)."""
    import re

    import msgspec

    obj = {}
    for f in msgspec.structs.fields(cls):
        if f.name not in skip:
            v = getattr(args, f.name, None)
            if v is not None and typing.get_origin(_unwrap(f.type)[0]) is dict:
                v = _pairs(v, option_name(f.name, flags))
            if v is not None:
                obj[f.name] = v
    obj.update(given or {})
    skip_args = {k: (names or {}).get(k, k.upper()) for k in (given or {})}
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as e:
        msg = str(e)
        m = re.fullmatch(r"Object missing required field `(\w+)`", msg)
        if m:
            msg = f"{option_name(m.group(1), flags)} is required"
        else:
            m = re.search(r" - at `(key` in `)?\$\.(\w+)(\S*)`$", msg)
            if m:
                field = m.group(2)
                name = skip_args.get(field) or option_name(field, flags)
                where = " (a KEY)" if m.group(1) else m.group(3)
                msg = f"{name}{where}: {msg[:m.start()]}"
        raise ReflexError("invalid_request", msg) from None


def _pairs(items, option) -> dict:
    """{KEY: VALUE} of repeated KEY=VALUE options; VALUE a number when it reads as one."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ReflexError("invalid_request", f"{option}: expected KEY=VALUE, not {item!r}")
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    return out


def read_text(value, what="PROMPT"):
    """`value`, or stdin's text when it is None or '-' (one trailing newline dropped)."""
    if value is not None and value != "-":
        return value
    stdin = sys.stdin
    if stdin is None or (value is None and stdin.isatty()):
        raise ReflexError("invalid_request", f"no {what}: give it as an argument, or '-' "
                                             "(or nothing) with the text on stdin")
    try:
        text = stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReflexError("invalid_request", f"stdin is not valid UTF-8 (byte {e.start})") from None
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text
