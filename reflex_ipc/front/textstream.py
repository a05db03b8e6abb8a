"""What the fronts (chat completions, messages, responses) share about a generated turn:
its reasoning, its content and its tool calls, apart, both for a result and while it
streams.

With `tools`, a tool call's markup (`<tool_call>`, `[TOOL_CALLS]`, DeepSeek's markers, a
Llama 3 JSON reply) must not reach the client as text: the engine parses the calls when
the generation ends, so streamed text is held back from the first marker on (and while
its tail could still become one). At the end `finish(result)` gives what is left of the
content (the result's `content`, outside the calls, past what was already sent) and the
calls.

Reasoning: the engine's result carries it as `reasoning_content` (and its token events
carry their part of it as `reasoning_content` beside `text`) when the engine separates
it; otherwise a reply that opens with `<think>` is split at `</think>` here.
"""

MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<｜tool▁calls▁begin｜>", "<|python_tag|>", "<function=")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _held_tail(text, markers):
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


def split_reasoning(result):
    """(reasoning or "", the reply's text without it, tool calls) of an engine result."""
    calls = result.get("tool_calls") or []
    text = result.get("content", "") if calls else result.get("text", "")
    if result.get("reasoning_content") is not None:
        return result.get("reasoning_content") or "", text, calls
    s = text.lstrip()
    if s.startswith(THINK_OPEN):
        end = s.find(THINK_CLOSE)
        if end < 0:  # cut off while thinking
            return s[len(THINK_OPEN):].lstrip("\n"), "", calls
        return s[len(THINK_OPEN):end].lstrip("\n"), s[end + len(THINK_CLOSE):].lstrip("\n"), calls
    return "", text, calls


class Turn:
    """feed(token event) -> [(kind, text)] that may go out now, kind "reasoning" or
    "content"; finish(result) -> ([(kind, text)] left, tool calls)."""

    def __init__(self, tools=False):
        self.tools = bool(tools)
        self.sent = {"reasoning": "", "content": ""}
        self.buf = ""          # content held back (tool markers)
        self.stopped = False   # a tool marker was seen: no more content goes out
        self.think = None      # None: not decided; "in": inside <think>; "out": past it / none
        self.tbuf = ""         # text before the think block is decided

    # -- content: tool markers ------------------------------------------------------------
    def _content(self, text):
        if not self.tools:
            return text
        if self.stopped:
            return ""
        self.buf += text
        if not self.sent["content"]:
            head = self.buf.lstrip()
            if head.startswith("{"):  # Llama 3: a JSON object is the whole reply
                self.stopped = True
                return ""
            if not head:
                return ""  # leading whitespace waits (it may precede a call)
        hits = [i for i in (self.buf.find(m) for m in MARKERS) if i >= 0]
        if hits:
            out, self.buf, self.stopped = self.buf[:min(hits)], "", True
        else:
            keep = _held_tail(self.buf, MARKERS)
            out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return out

    # -- reasoning: <think> ---------------------------------------------------------------
    def _split(self, text):
        """[(kind, text)] before the tool filter."""
        if self.think == "out":
            return [("content", text)]
        self.tbuf += text
        out = []
        if self.think is None:
            head = self.tbuf.lstrip()
            if head.startswith(THINK_OPEN):
                self.think, self.tbuf = "in", head[len(THINK_OPEN):].lstrip("\n")
            elif THINK_OPEN.startswith(head):
                return []  # still may be the opening tag
            else:
                self.think, rest, self.tbuf = "out", self.tbuf, ""
                return [("content", rest)]
        i = self.tbuf.find(THINK_CLOSE)
        if i >= 0:
            if self.tbuf[:i]:
                out.append(("reasoning", self.tbuf[:i]))
            rest = self.tbuf[i + len(THINK_CLOSE):].lstrip("\n")
            self.think, self.tbuf = "out", ""
            if rest:
                out.append(("content", rest))
            return out
        keep = _held_tail(self.tbuf, (THINK_CLOSE,))
        piece, self.tbuf = self.tbuf[:len(self.tbuf) - keep], self.tbuf[len(self.tbuf) - keep:]
        if piece:
            out.append(("reasoning", piece))
        return out

    def _emit(self, pieces):
        out = []
        for kind, text in pieces:
            if kind == "content":
                text = self._content(text)
            if text:
                self.sent[kind] += text
                if out and out[-1][0] == kind:
                    out[-1] = (kind, out[-1][1] + text)
                else:
                    out.append((kind, text))
        return out

    def feed(self, ev):
        out = []
        reasoning = ev.get("reasoning_content")
        if reasoning is not None:  # the engine splits the reasoning off itself
            self.think = "out"
            out += self._emit([("reasoning", reasoning)])
        text = ev.get("text", "")
        if text:
            out += self._emit(self._split(text))
        return out

    def finish(self, result):
        reasoning, content, calls = split_reasoning(result)
        out = []
        if self.think == "in" and self.tbuf:  # an unclosed think block: all of it was reasoning
            self.tbuf = ""
        for kind, final in (("reasoning", reasoning), ("content", content)):
            sent = self.sent[kind]
            if final.startswith(sent):
                rest = final[len(sent):]
            else:
                rest = "" if final.strip() == sent.strip() or sent.strip().startswith(final.strip()) else final
            if rest:
                self.sent[kind] += rest
                out.append((kind, rest))
        return out, calls
