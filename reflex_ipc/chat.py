"""Chat templates: `messages` (and `tools`) rendered with the GGUF's
`tokenizer.chat_template`, then tokenized as llama.cpp's chat path does.

Imported only when a request carries `messages` (jinja2 costs ~30 ms to import;
nothing on the cold path may pay it). Templates run in jinja2's
ImmutableSandboxedEnvironment with what Hugging Face's and llama.cpp's chat
templates expect: `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension,
`{% generation %}` blocks passed through, `tojson` writing non-ASCII as is,
`raise_exception(msg)` and `strftime_now(fmt)`, and the variables `messages`,
`tools`, `add_generation_prompt`, `bos_token`, `eos_token` plus any
`chat_template_kwargs` (such as Qwen3's `enable_thinking`).

BOS/EOS as llama.cpp's server chat path: the rendered text loses a leading
BOS text when the vocabulary adds BOS itself (and a trailing EOS text when it
adds EOS), then it is tokenized with special tokens parsed and the
vocabulary's own add flags. For a template that writes `{{ bos_token }}`
(Llama 3, Gemma) or one on a vocabulary without BOS (ChatML, Qwen) this gives
the same ids as llama-cpp-python's Jinja2ChatFormatter (tests/test_chat.py).

Every failure is ReflexError("invalid_request", ...) naming the field:
`messages` for malformed messages or a template that raises on them,
`chat_template` for a template that does not compile. A template is code
from the model file: its source, run time, every value it builds and its
output are bounded (MAX_TEMPLATE_BYTES, COMPILE_SECONDS, RENDER_SECONDS, the
caps of _Limits: the sandbox's operators, string methods and filters that
can multiply their input are checked before they run), past which it is
`too_large`; `cancelled` when should_cancel() says so while it runs.
"""

from __future__ import annotations

import json
from functools import lru_cache

from .errors import ReflexError

ROLES_HINT = "system, user, assistant, tool"


def _bad(field, msg):
    return ReflexError("invalid_request", f"`{field}`: {msg}")


def validate_messages(messages) -> list:
    """The messages as plain dicts, checked: a non-empty list of objects, each
    with a string `role` and a `content` that is a string, null, or a list of
    text parts ({"type": "text", "text": ...}). Other keys (name, tool_calls,
    tool_call_id, reasoning_content) pass through to the template."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty array of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"{where}.role", "must be a non-empty string")
        if "content" not in m and "tool_calls" not in m:
            raise _bad(f"{where}.content", "is required")
        c = m.get("content")
        if isinstance(c, list):
            for j, part in enumerate(c):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise _bad(f"{where}.content[{j}]",
                               'content parts must be {"type": "text", "text": string}')
        elif c is not None and not isinstance(c, str):
            raise _bad(f"{where}.content", f"must be a string, null or an array of text parts, "
                                           f"got {type(c).__name__}")
        tc = m.get("tool_calls")
        if tc is not None:
            if not isinstance(tc, list):
                raise _bad(f"{where}.tool_calls", "must be an array")
            for j, call in enumerate(tc):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise _bad(f"{where}.tool_calls[{j}]",
                               'must be {"type": "function", "function": {"name", "arguments"}}')
        out.append(dict(m))
    return out


def validate_tools(tools):
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be an array of {type: function, function: {name, ...}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}]", 'must be {"type": "function", "function": {"name", '
                                      '"description", "parameters"}}')
    return tools


# -- bounds (protocol/PROTOCOL.md, "Bounds") ---------------------------------------------------
# A chat template is code from the model file (or the request): it runs in jinja2's sandbox,
# which keeps it from the host, but not from spending time and memory. These bound both.
MAX_TEMPLATE_BYTES = 128 << 10  # a template's source; compiling costs ~8 ms per KiB of tags
RENDER_SECONDS = 2.0  # one render (real templates: a few ms)
COMPILE_SECONDS = 5.0  # one compile (once per template: cached by content)
MAX_INT_BITS = 1 << 16  # an integer a template computes (str() refuses > 4300 digits anyway)
MAX_ITEMS = 1 << 20  # items of a list or string a template builds by repetition or splitting
BASE_CHARS = 1 << 20  # every value, and the output: at most BASE_CHARS + 2 x the input's text
ALLOC_FACTOR = 8  # all the text a render's guarded operations produce: 8 x that


class _TooLarge(Exception):
    """A template operation past a bound (an Exception: jinja's compile-time constant
    folding swallows it and leaves the operation to run time, where it is raised again)."""


class _Stop(BaseException):
    """The step or time budget is spent, or the request was cancelled: raised from the trace
    function, so no `except Exception` in jinja or in a filter can swallow it."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind, self.message = kind, message


class _Limits:
    """What one compile or render may spend (characters per value and in all)."""

    def __init__(self, cap=BASE_CHARS):
        self.cap = cap
        self.budget = ALLOC_FACTOR * cap
        self.used = 0

    def value(self, n, what):
        if n > self.cap:
            raise _TooLarge(f"{what} would be {n} long; the limit is {self.cap}")

    def charge(self, n, what):
        self.value(n, what)
        self.used += n
        if self.used > self.budget:
            raise _TooLarge(f"the template produced {self.used} characters in all; the limit is "
                            f"{self.budget}")


_LIMITS = _Limits()  # the render's, while one runs (compile time: the default)


def _size(x, limit) -> int:
    """An upper estimate of len(str(x)), walking containers; stops once past `limit` (so a
    list holding one big string many times costs a few steps, not its printed size)."""
    total, stack, seen = 0, [x], 0
    while stack:
        v = stack.pop()
        seen += 1
        if isinstance(v, (str, bytes, bytearray)):
            total += len(v) * (4 if not isinstance(v, str) else 1) + 2
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, float):
            total += 24
        elif isinstance(v, dict):
            total += 2
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + len(v)
            stack.extend(v)
        else:
            total += 64
        if total > limit or seen > limit:
            return max(total, seen)
    return total


def _text_size(x) -> int:
    return len(x) if isinstance(x, str) else _size(x, _LIMITS.cap)


def _repeat(seq, n, what):
    """len(seq) * n checked: text by characters, lists by items."""
    n = int(n)
    if isinstance(seq, str):
        _LIMITS.charge(len(seq) * max(n, 0), what)
    elif len(seq) * max(n, 0) > MAX_ITEMS:
        raise _TooLarge(f"{what} would have {len(seq) * n} items; the limit is {MAX_ITEMS}")


_SPEC_NUM = None


def _check_spec(spec, what):
    """Widths and precisions in a format spec ('{:>9}', '%-9.3s') are bounded by the cap."""
    global _SPEC_NUM
    if _SPEC_NUM is None:
        import re

        _SPEC_NUM = re.compile(r"\d+")
    for m in _SPEC_NUM.finditer(spec):
        if len(m.group()) > 7 or int(m.group()) > _LIMITS.cap:
            raise _TooLarge(f"{what}: a width of {m.group()[:20]} is past the limit of {_LIMITS.cap}")


_PCT = None


def _percent(fmt, args, what="'%' formatting"):
    """fmt % args with its widths, '*' widths and arguments' sizes checked first."""
    global _PCT
    if _PCT is None:
        import re

        _PCT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
    if isinstance(fmt, (bytes, bytearray)):
        fmt_s = fmt.decode("latin-1")
    else:
        fmt_s = fmt
    for m in _PCT.finditer(fmt_s):
        _check_spec(m.group(0)[1:].replace("*", ""), what)
    vals = args if isinstance(args, tuple) else (args,)
    for v in vals:
        if isinstance(v, int) and not isinstance(v, bool):
            _check_spec(str(abs(v)) if v.bit_length() < 64 else "9" * 30, what)  # '*' widths
    _LIMITS.charge(len(fmt) + sum(_size(v, _LIMITS.cap) for v in vals), what)
    return fmt % args


def _binop(op, a, b):
    import operator

    if op == "**":
        if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1:
            if b * max(1, abs(a).bit_length() - 1) > MAX_INT_BITS:
                raise _TooLarge(f"{a!r:.20} ** {b} would have over {MAX_INT_BITS} bits")
        return operator.pow(a, b)
    if op == "*":
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, bytes, bytearray, list, tuple)) and isinstance(n, int):
                _repeat(seq, n, "a repeated value")
        if isinstance(a, int) and isinstance(b, int):
            if a.bit_length() + b.bit_length() > MAX_INT_BITS:
                raise _TooLarge(f"a product would have over {MAX_INT_BITS} bits")
        return operator.mul(a, b)
    if op == "+":
        if isinstance(a, str) and isinstance(b, str):
            _LIMITS.charge(len(a) + len(b), "a concatenation")
        elif isinstance(a, (list, tuple, bytes)) and isinstance(b, (list, tuple, bytes)) and \
                len(a) + len(b) > MAX_ITEMS * (8 if isinstance(a, bytes) else 1):
            raise _TooLarge(f"a concatenation would have {len(a) + len(b)} items")
        return operator.add(a, b)
    if op == "%" and isinstance(a, (str, bytes, bytearray)):
        return _percent(a, b)
    return {"-": operator.sub, "/": operator.truediv, "//": operator.floordiv,
            "%": operator.mod}[op](a, b)


def _guard_method(obj, name, fn):
    """A str/bytes/int method as a template may call it, with its output bounded."""
    if not callable(fn) or name.startswith("_"):
        return fn
    if isinstance(obj, (str, bytes, bytearray)):
        n = len(obj)

        def guarded(*args, **kw):
            if name in ("ljust", "rjust", "center", "zfill") and args:
                _LIMITS.charge(max(n, int(args[0]) if isinstance(args[0], int) else 0), f"str.{name}")
            elif name == "expandtabs":
                ts = args[0] if args else kw.get("tabsize", 8)
                if isinstance(ts, int):
                    _LIMITS.charge(n + obj.count("\t" if isinstance(obj, str) else b"\t") * max(ts, 0),
                                   "str.expandtabs")
            elif name == "replace" and len(args) >= 2:
                old, new = args[0], args[1]
                if isinstance(old, (str, bytes)) and isinstance(new, (str, bytes)):
                    k = obj.count(old) if old else n + 1
                    if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                        k = min(k, args[2])
                    _LIMITS.charge(n + k * max(0, len(new) - len(old)), "str.replace")
            elif name == "join" and args:
                parts = list(args[0]) if not isinstance(args[0], (list, tuple)) else args[0]
                _LIMITS.charge(sum(_text_size(p) for p in parts) + n * len(parts), "str.join")
                args = (parts,) + args[1:]
            elif name in ("split", "rsplit", "splitlines"):
                if n > MAX_ITEMS:
                    raise _TooLarge(f"str.{name} of {n} characters; the limit is {MAX_ITEMS}")
            elif name == "translate" and args and isinstance(args[0], dict):
                w = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
                _LIMITS.charge(n * max(w, 1), "str.translate")
            elif name in ("format", "format_map"):
                return _format(obj, name, args, kw)
            out = fn(*args, **kw)
            if isinstance(out, (str, bytes, bytearray)):
                _LIMITS.charge(len(out), f"str.{name}")
            elif isinstance(out, list) and len(out) > MAX_ITEMS:
                raise _TooLarge(f"str.{name} gave {len(out)} items; the limit is {MAX_ITEMS}")
            return out

        return guarded
    if isinstance(obj, int) and name == "to_bytes":
        def to_bytes(length=1, *a, **kw):
            if isinstance(length, int) and length > _LIMITS.cap:
                raise _TooLarge(f"int.to_bytes({length}) is past the limit of {_LIMITS.cap}")
            return fn(length, *a, **kw)

        return to_bytes
    return fn


_FORMATTER = None


def _format(s, name, args, kw):
    """str.format / format_map through jinja's sandboxed formatter, each field's spec and
    value checked before it is formatted."""
    global _FORMATTER
    if _FORMATTER is None:
        from jinja2.sandbox import SandboxedFormatter

        class Formatter(SandboxedFormatter):
            def format_field(self, value, format_spec):
                _check_spec(format_spec, "str.format")
                _LIMITS.charge(_size(value, _LIMITS.cap), "str.format")
                return super().format_field(value, format_spec)

        _FORMATTER = Formatter
    if not isinstance(s, str):
        raise TypeError(f"{type(s).__name__}.{name} is not available in templates")
    if name == "format_map":
        if kw or len(args) != 1:
            raise TypeError("format_map() takes exactly one argument")
        args, kw = (), args[0]
    out = _FORMATTER(_ENV).vformat(s, args, kw)
    _LIMITS.charge(len(out), "str.format")
    return type(s)(out)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    for v in (indent, *(separators or ())):
        if (isinstance(v, int) and v > 64) or (isinstance(v, str) and len(v) > 64):
            raise _TooLarge("tojson: an indent or separator over 64 characters")
    n = _size(x, _LIMITS.cap)
    _LIMITS.charge(n * (1 + (2 if indent else 0)), "tojson")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    from datetime import datetime

    if not isinstance(fmt, str):
        raise TypeError("strftime_now takes a format string")
    _check_spec(fmt, "strftime_now")
    if len(fmt) > 1024:
        raise _TooLarge("strftime_now: a format over 1024 characters")
    return datetime.now().strftime(fmt)


class _TemplateRaised(Exception):
    pass


def _raise_exception(message):
    raise _TemplateRaised(str(message))


def _need_jinja2():
    """invalid_request naming the extra when jinja2 (the `chat` extra) is not installed."""
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise ReflexError("invalid_request", "chat templates (`messages`, --chat) need jinja2: "
                          "pip install 'reflex-ipc[chat]'") from None


def _guard_filters(filters):
    """Every filter's text output is charged to the render; the ones that can multiply their
    input (widths, repeats, serializations) are checked before they run."""
    import functools

    pre = {
        "center": lambda v, width=80, *a, **k: _LIMITS.charge(
            max(_text_size(v), width if isinstance(width, int) else 0), "center"),
        "indent": lambda v, width=4, *a, **k: _LIMITS.charge(
            _text_size(v) + (str(v).count("\n") + 1) * (len(width) if isinstance(width, str) else
                                                         width if isinstance(width, int) else 0),
            "indent"),
        "wordwrap": lambda env, v, width=79, break_long_words=True, wrapstring=None, *a, **k: _LIMITS.charge(
            _text_size(v) * (1 + len(wrapstring or "\n") // max(1, width if isinstance(width, int) else 1)),
            "wordwrap"),
        "replace": lambda ctx, v, old, new, count=None: _LIMITS.charge(
            _text_size(v) + (str(v).count(str(old)) if str(old) else _text_size(v) + 1)
            * max(0, len(str(new)) - len(str(old))), "replace"),
        "join": lambda ctx, v, d="", attribute=None: None,
        "pprint": lambda v, *a, **k: _LIMITS.charge(2 * _size(v, _LIMITS.cap), "pprint"),
        "string": lambda v: _LIMITS.charge(_text_size(v), "string"),
        # jinja's `list` takes the eval context first (a pass_eval_context async variant)
        "list": lambda *a: isinstance(a[-1], str) and _repeat([0], len(a[-1]), "list"),
        "batch": lambda v, linecount, *a, **k: _repeat([0], linecount if isinstance(linecount, int) else 0,
                                                       "batch"),
        "sum": lambda ctx, v, *a, **k: None,
    }

    def wrap(name, f):
        check = pre.get(name)

        @functools.wraps(f)
        def guarded(*args, **kw):
            if check is not None:
                check(*args, **kw)
            out = f(*args, **kw)
            if isinstance(out, str):
                _LIMITS.charge(len(out), name)
            elif isinstance(out, list) and len(out) > MAX_ITEMS:
                raise _TooLarge(f"{name} gave {len(out)} items; the limit is {MAX_ITEMS}")
            return out

        return guarded

    for name, f in list(filters.items()):
        if name == "join":  # materialized, so the parts can be measured before joining
            filters[name] = _guarded_join(f)
        elif name == "sum":
            filters[name] = _guarded_sum(f)
        elif name == "format":
            filters[name] = wrap(name, _format_filter)
        elif name != "tojson":
            filters[name] = wrap(name, f)


def _format_filter(value, *args, **kwargs):
    """jinja's `format` filter (printf-style), its widths and arguments checked first."""
    if args and kwargs:
        raise TypeError("format: give positional or keyword arguments, not both")
    return _percent(value if isinstance(value, str) else str(value), kwargs or args, "format")


def _guarded_join(f):
    import functools

    @functools.wraps(f)
    def join(ctx, value, d="", attribute=None):
        if attribute is None:
            value = list(value)
            _LIMITS.charge(sum(_text_size(v) for v in value) + len(value) * _text_size(d), "join")
        out = f(ctx, value, d, attribute)
        _LIMITS.charge(len(out), "join")
        return out

    return join


def _guarded_sum(f):
    import functools

    @functools.wraps(f)
    def total(ctx, iterable, attribute=None, start=0):
        if isinstance(start, (list, tuple, str)):  # concatenating: quadratic in the parts
            iterable = list(iterable)
            n = len(start) + sum(len(v) for v in iterable if isinstance(v, (list, tuple, str)))
            if n > MAX_ITEMS:
                raise _TooLarge(f"sum would have {n} items; the limit is {MAX_ITEMS}")
        return f(ctx, iterable, attribute=attribute, start=start)

    return total


def _finalize(value):
    """What `{{ x }}` prints: text as it is, anything else measured before str() runs."""
    if not isinstance(value, str):
        _LIMITS.charge(_size(value, _LIMITS.cap), "an output value")
    return value


_ENV = None


def _environment():
    """The one sandboxed environment (jinja2 imported on first use)."""
    global _ENV
    if _ENV is not None:
        return _ENV
    _need_jinja2()
    import jinja2
    import jinja2.ext
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        """Hugging Face's `{% generation %}...{% endgeneration %}`: rendered as is."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: measured before it is joined
            self.write("environment.rx_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("+", "*", "**", "%"))
        code_generator_class = Generator

        def call_binop(self, context, operator, left, right):
            return _binop(operator, left, right)

        def getattr(self, obj, attribute):
            return _guard_method(obj, attribute, super().getattr(obj, attribute))

        def getitem(self, obj, argument):
            v = super().getitem(obj, argument)
            return _guard_method(obj, argument, v) if isinstance(argument, str) else v

        def rx_concat(self, parts):
            _LIMITS.charge(sum(_text_size(p) for p in parts), "a `~` concatenation")
            return "".join([p if isinstance(p, str) else str(p) for p in parts])

    env = Env(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
              extensions=[_Generation, jinja2.ext.loopcontrols])
    _guard_filters(env.filters)
    env.filters["tojson"] = _tojson
    env.globals.pop("lipsum", None)  # n paragraphs of filler: nothing a chat template needs
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    _ENV = env
    return env


class _Budget:
    """Ends a compile or render with _Stop once it has run `seconds`, or once should_cancel()
    says so (SIGINT; a uds client that hung up), checked every TICK seconds.

    In the main thread (the server loop, the CLI) an interval timer's SIGALRM does the
    checking: nothing runs per Python call, and the handler raises between two bytecodes
    of whatever runs. Elsewhere a trace function counts Python calls and template lines and
    checks every 1024 of them (a render then runs a few times slower). C code runs between
    two checks unobserved: the guards above bound what one C call can do."""

    TICK = 0.05
    _installed = False
    _active = None  # the budget whose timer runs (main thread only)

    def __init__(self, seconds, should_cancel, what):
        import time

        self.seconds, self.should_cancel, self.what = seconds, should_cancel, what
        self._time = time.monotonic
        self.deadline = self._time() + seconds

    def check(self):
        if self._time() > self.deadline:
            raise _Stop("too_large", f"the chat template's {self.what} ran past its budget of "
                                     f"{self.seconds:g} s")
        if self.should_cancel is not None and self.should_cancel():
            raise _Stop("cancelled", f"cancelled while the chat template's {self.what} ran")

    @classmethod
    def _on_alarm(cls, signum, frame):
        b = cls._active
        if b is not None:
            b.check()

    def run(self, fn, *args):
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread() or _Budget._active is not None:
            return self._run_traced(fn, *args)
        if not _Budget._installed:  # once: a late SIGALRM after a render finds no budget
            signal.signal(signal.SIGALRM, _Budget._on_alarm)
            _Budget._installed = True
        _Budget._active = self
        signal.setitimer(signal.ITIMER_REAL, self.TICK, self.TICK)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _Budget._active = None

    def _run_traced(self, fn, *args):
        import sys

        n = [0]

        def local(frame, event, arg):
            if event == "line":
                n[0] += 1
                if not n[0] & 1023:
                    self.check()
            return local

        def trace(frame, event, arg):
            n[0] += 1
            if not n[0] & 1023:
                self.check()
            return local if frame.f_code.co_filename == "<template>" else None

        prev = sys.gettrace()
        sys.settrace(trace)
        try:
            return fn(*args)
        finally:
            sys.settrace(prev)


def _source_size(source) -> int:
    return len(source.encode("utf-8", "surrogatepass"))


@lru_cache(maxsize=16)
def compile_template(source: str):
    """The compiled jinja2 template, or the ReflexError that compiling it gave: cached by
    the source's content (compiled once per model; a template that fails is not compiled
    again). Cancellation is not cached (compiled_template raises it)."""
    return _compile(source)


_COMPILE_CANCEL = [None]  # the should_cancel of the compile in progress


MAX_NESTING = 40  # block tags inside each other (real templates: < 10; Python compiles 20 loops)
_BLOCK_OPEN = ("for", "if", "macro", "call", "filter", "block", "with", "generation", "raw")


def _nesting(source) -> int:
    """The deepest nesting of block tags ({% for %} ... {% endfor %}), by a scan of the tag names:
    a template nested past MAX_NESTING cannot compile (Python allows 20 nested loops and 100
    indentation levels), and jinja takes seconds to find that out at 200 levels."""
    import re

    depth = deepest = 0
    for m in re.finditer(r"\{%[-+]?\s*(\w+)", source):
        word = m.group(1)
        if word in _BLOCK_OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif word.startswith("end") and word[3:] in _BLOCK_OPEN:
            depth -= 1
    return deepest


def _compile(source):
    import jinja2

    env = _environment()
    n = _source_size(source)
    if n > MAX_TEMPLATE_BYTES:
        return ReflexError("too_large", f"`chat_template`: the template is {n} bytes; the limit is "
                                        f"{MAX_TEMPLATE_BYTES}")
    depth = _nesting(source)
    if depth > MAX_NESTING:
        return _bad("chat_template", f"the template does not compile: its blocks nest {depth} deep; "
                                     f"at most {MAX_NESTING} compile")
    budget = _Budget(COMPILE_SECONDS, _COMPILE_CANCEL[0], "compile")
    try:
        return budget.run(env.from_string, source)
    except _Stop as e:
        if e.kind == "cancelled":
            raise
        return ReflexError(e.kind, e.message)
    except jinja2.TemplateSyntaxError as e:
        return _bad("chat_template", f"the template does not compile: {e.message} (line {e.lineno})")
    except (MemoryError, RecursionError, SyntaxError, ValueError, TypeError, OverflowError,
            _TooLarge, jinja2.TemplateError) as e:
        # deep nesting past the parser's or Python's limits, constants that cannot be
        # printed, ...
        return _bad("chat_template", f"the template does not compile: {type(e).__name__}: "
                                     f"{str(e)[:300]}")


def compiled_template(source: str, should_cancel=None):
    """compile_template's template, raising its ReflexError (or `cancelled`)."""
    _COMPILE_CANCEL[0] = should_cancel
    try:
        t = compile_template(source)
    except _Stop as e:
        raise ReflexError(e.kind, e.message) from None
    finally:
        _COMPILE_CANCEL[0] = None
    if isinstance(t, ReflexError):
        raise ReflexError(t.kind, t.message)
    return t


def template_of(tok, f, override=None) -> str:
    """The template source: `override` when given, else the GGUF's."""
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise _bad("chat_template", "must be a non-empty string")
        return override
    src = f.metadata.get("tokenizer.chat_template") if f is not None else None
    if not isinstance(src, str) or not src.strip():
        raise _bad("messages", "this model has no chat template (tokenizer.chat_template); "
                               "send `prompt`, or give `chat_template`")
    return src


def special_text(tok, tid) -> str:
    """A special token's text as stored in the vocabulary ("" when absent)."""
    if tid is None or tid < 0:
        return ""
    return tok.token_text(tid)


def _input_chars(*values) -> int:
    return sum(_size(v, 1 << 40) for v in values if v is not None)


def render(tok, f, messages, *, tools=None, add_generation_prompt=True, chat_template=None,
           chat_template_kwargs=None, should_cancel=None) -> str:
    """The rendered prompt text (before llama.cpp's BOS/EOS stripping), within the bounds
    above: `too_large` past a step, time or size bound, `cancelled` when should_cancel()
    says so while the template runs (SIGINT; SIGTERM ends the loop after it)."""
    global _LIMITS
    _need_jinja2()
    import jinja2

    messages = validate_messages(messages)
    tools = validate_tools(tools)
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise _bad("chat_template_kwargs", "must be an object")
    tmpl = compiled_template(template_of(tok, f, chat_template), should_cancel)
    ctx = dict(chat_template_kwargs or {})
    ctx.update(messages=messages, tools=tools, add_generation_prompt=bool(add_generation_prompt),
               bos_token=special_text(tok, tok.bos_id), eos_token=special_text(tok, tok.eos_id))
    if tools is None:
        ctx.pop("tools")  # templates test `tools is defined` as well as `tools is not none`
    limits = _Limits(BASE_CHARS + 2 * _input_chars(messages, tools, chat_template_kwargs))

    def run():
        out, n = [], 0
        for piece in tmpl.root_render_func(tmpl.new_context(ctx)):
            n += len(piece)
            if n > limits.cap:
                raise _TooLarge(f"the rendered prompt would be over {limits.cap} characters")
            if piece:  # (empty pieces cost no characters, but 8 bytes each in the list: a loop
                out.append(piece)  # printing '' for the whole budget held 138 MiB of them)
        return "".join(out)

    saved, _LIMITS = _LIMITS, limits
    try:
        text = _Budget(RENDER_SECONDS, should_cancel, "render").run(run)
    except _Stop as e:
        raise ReflexError(e.kind, e.message) from None
    except _TooLarge as e:
        raise ReflexError("too_large", f"`chat_template`: {e}") from None
    except MemoryError:
        raise ReflexError("too_large", "`chat_template`: the template ran out of memory") from None
    except _TemplateRaised as e:
        raise _bad("messages", f"the chat template rejected them: {e}") from None
    except jinja2.exceptions.SecurityError as e:
        raise _bad("chat_template", f"the template did something the sandbox forbids: {e}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, LookupError,
            ZeroDivisionError, RecursionError, OverflowError, ArithmeticError) as e:
        raise _bad("messages", f"the chat template failed on them: {type(e).__name__}: "
                               f"{str(e)[:300]}") from None
    finally:
        _LIMITS = saved
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _bad("chat_template", f"the template wrote text that is not Unicode (a lone "
                                        f"surrogate, {text[e.start]!r}, at {e.start})") from None
    return text


def strip_specials(tok, text: str) -> str:
    """llama.cpp's chat path: a leading BOS text goes when the vocabulary adds BOS
    itself, a trailing EOS text when it adds EOS (tokenization puts them back)."""
    bos = special_text(tok, tok.bos_id)
    eos = special_text(tok, tok.eos_id)
    if getattr(tok, "add_bos", False) and bos and text.startswith(bos):
        text = text[len(bos):]
    if getattr(tok, "add_eos", False) and eos and text.endswith(eos):
        text = text[: -len(eos)]
    return text


def chat_prompt(tok, f, messages, **kw) -> list:
    """Token ids of the rendered conversation, as llama.cpp's chat path makes them."""
    text = strip_specials(tok, render(tok, f, messages, **kw))
    return tok.encode(text, add_bos=None, parse_special=True)
