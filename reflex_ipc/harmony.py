"""gpt-oss's harmony format (the o200k_harmony vocabulary): the channels of its replies, for
the generate result's `reasoning_content` and tool calls.

An assistant reply is a run of messages, each `[<|start|>assistant]HEADER<|message|>BODY` ended
by `<|end|>` (more follows), `<|return|>` or `<|call|>` (end of generation: not in the text) or
the next `<|start|>`. The header names the channel (`<|channel|>analysis`, `commentary`,
`final`), optionally a recipient (` to=functions.NAME`, before or after the channel) and a
content type (`<|constrain|>json` or ` json`). The chat template ends the prompt with
`<|start|>assistant`, so the output starts with a header. llama.cpp renders `<|channel|>`,
`<|message|>`, `<|start|>`, `<|constrain|>` and `<|end|>` as text for this vocabulary (the
tokenizer does too), so the splitting works on the decoded text:

- analysis bodies -> reasoning_content;
- final bodies, and commentary without a recipient (a preamble) -> the content;
- a message to `functions.NAME` -> a tool call: the splitter puts it into the content as one
  canonical block `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS
  <|call|>` (the template's own rendering of a call), which `tool_calls` (toolcalls.py, with
  `tools`) turns into OpenAI's shape.

Text that does not start like a header (a model off its format, a plain prompt) is content as
it is. Imported only by requests on such a vocabulary (generation/, toolcalls.py).
"""

from __future__ import annotations

import json
import re

START, MESSAGE, END, CALL, RETURN, CHANNEL, CONSTRAIN = (
    "<|start|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|channel|>", "<|constrain|>")
_ENDS = (END, CALL, RETURN, START)
MAX_HEADER = 512  # a header longer than this is not one: the text is content as it is

_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_TO = re.compile(r"\bto=([^\s<]+)")
_MSG = re.compile(r"(?:<\|start\|>[A-Za-z_]*)?((?:(?!<\|message\|>|<\|start\|>|<\|end\|>).){0,512}?)<\|message\|>"
                  r"(.*?)(<\|end\|>|<\|call\|>|<\|return\|>|(?=<\|start\|>)|\Z)", re.S)


def is_harmony(tok) -> bool:
    """Whether a tokenizer's vocabulary is o200k_harmony's (its channel markers are tokens)."""
    return all(tok.find_text(t) >= 0 for t in (CHANNEL, MESSAGE, START, END))


def header(text):
    """(channel or None, recipient or None) of a message header."""
    c, t = _CHANNEL.search(text), _TO.search(text)
    return (c.group(1) if c else None), (t.group(1) if t else None)


def call_block(name, args):
    """A tool call as the chat template renders it (a finished call message)."""
    return f"{START}assistant to=functions.{name}{CHANNEL}commentary json{MESSAGE}{args}{CALL}"


def _partial(text, tags):
    """The length of the longest tail of text that is a proper prefix of one of tags."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


def _looks_like_header(s) -> bool:
    """Whether text (left-stripped) may begin a message header (or is a prefix of one)."""
    for tag in (CHANNEL, START, "to=", CONSTRAIN):
        if s.startswith(tag) or tag.startswith(s):
            return True
    return False


class HarmonySplitter:
    """generation's reasoning splitter for harmony replies: push(text) -> (content, reasoning)
    that became final; finish() -> what was held back (ReasoningSplitter's interface)."""

    def __init__(self):
        self.state = "header"  # header | body | plain
        self.kind = None  # of the body: "reasoning", "content" or ("call", name)
        self.buf = ""
        self.pending = ""  # a call's arguments so far

    def _open(self, head):
        channel, to = header(head)
        if to is not None and to.startswith("functions."):
            self.kind = ("call", to[len("functions."):])
        elif channel == "analysis":
            self.kind = "reasoning"
        else:
            self.kind = "content"

    def push(self, text):
        content = reasoning = ""
        buf = self.buf + text
        self.buf = ""
        while buf:
            if self.state == "plain":
                content, buf = content + buf, ""
            elif self.state == "header":
                s = buf.lstrip()
                if not _looks_like_header(s) or (MESSAGE not in buf and len(buf) > MAX_HEADER):
                    self.state = "plain"
                    continue
                i = buf.find(MESSAGE)
                if i < 0:
                    self.buf = buf
                    break
                self._open(buf[:i])
                buf, self.state = buf[i + len(MESSAGE):], "body"
            else:  # body
                hits = [(buf.find(t), t) for t in _ENDS if t in buf]
                if hits:
                    i, tag = min(hits)
                    c, r = self._emit(buf[:i], True)
                    content, reasoning = content + c, reasoning + r
                    buf = buf[i:] if tag == START else buf[i + len(tag):]
                    self.state, self.kind = "header", None
                    continue
                keep = _partial(buf, _ENDS)
                c, r = self._emit(buf[:len(buf) - keep], False)
                content, reasoning = content + c, reasoning + r
                self.buf = buf[len(buf) - keep:]
                break
        return content, reasoning

    def _emit(self, body, done):
        """(content, reasoning) of body text of the open message (a call's at its end)."""
        if self.kind == "reasoning":
            return "", body
        if isinstance(self.kind, tuple):
            self.pending += body
            if not done:
                return "", ""
            args, self.pending = self.pending, ""
            return call_block(self.kind[1], args.strip()), ""
        return body, ""

    def finish(self):
        """(content, reasoning) held back when the text ended (a call's end of generation)."""
        buf, self.buf = self.buf, ""
        if self.state in ("header", "plain"):
            return (buf if self.state == "plain" or not buf.strip() or not _looks_like_header(buf.lstrip())
                    else ""), ""
        return self._emit(buf, True)


def messages(text):
    """[(start, end, channel, recipient, body)] of the harmony messages in text."""
    out = []
    for m in _MSG.finditer(text):
        channel, to = header(m.group(1))
        if channel is None and to is None and not m.group(0).startswith(START):
            continue  # "<|message|>" alone is not a message header
        out.append((m.start(), m.end(), channel, to, m.group(2)))
    return out


def tool_calls(text, names=()):
    """(content, calls) of harmony text: calls [(name, JSON arguments text)] of the messages to
    functions.NAME (NAME among names, when given) whose body is a JSON object; content the text
    outside every message plus the final / recipient-less commentary bodies (analysis dropped).
    calls is [] when there is none (content is then text as it is)."""
    names = set(names or ())
    found, calls, content, last = messages(text), [], [], 0
    for start, end, channel, to, body in found:
        content.append(text[last:start])
        last = end
        if to is not None and to.startswith("functions."):
            name = to[len("functions."):]
            try:
                ok = isinstance(json.loads(body), dict)
            except ValueError:
                ok = False
            if ok and (not names or name in names):
                calls.append((name, body.strip()))
                continue
            content.append(text[start:end])
        elif channel != "analysis":
            content.append(body)
    content.append(text[last:])
    if not calls:
        return text, []
    return "".join(content).strip(), calls
