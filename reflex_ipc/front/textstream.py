"""What the fronts (chat completions, messages, responses) share about a generated turn:
its reasoning, its content and its tool calls, apart, both for a result and while it
streams.

Reasoning is the engine's: a chat with a reasoning model (a vocabulary with <think> and
</think> tokens) gets its result's `reasoning_content` and its token events'
`reasoning_content` beside `text` (generation/reasoning.py); the front only routes them.

With `tools`, a tool call's markup (`<tool_call>`, `[TOOL_CALLS]`, DeepSeek's markers, a
Llama 3 JSON reply) must not reach the client as text: the engine parses the calls when
the generation ends, so streamed text is held back from the first marker on (and while
its tail could still become one). At the end `finish(result)` gives what is left of the
content (the result's `content`, outside the calls, past what was already sent) and the
calls.
"""

MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<｜tool▁calls▁begin｜>", "<|python_tag|>", "<function=")


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
    """(reasoning or "", the reply's text without it, tool calls) of an engine result (or
    one of its choices)."""
    calls = result.get("tool_calls") or []
    text = result.get("content", "") if calls else result.get("text", "")
    return result.get("reasoning_content") or "", text, calls


class Turn:
    """feed(token event) -> [(kind, text)] that may go out now, kind "reasoning" or
    "content"; finish(result) -> ([(kind, text)] left, tool calls)."""

    __slots__ = ("tools", "sent", "buf", "stopped")

    def __init__(self, tools=False):
        self.tools = bool(tools)
        self.sent = {"reasoning": "", "content": ""}
        self.buf = ""          # content held back (tool markers)
        self.stopped = False   # a tool marker was seen: no more content goes out

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

    def feed(self, ev):
        out = []
        reasoning = ev.get("reasoning_content")
        if reasoning:
            self.sent["reasoning"] += reasoning
            out.append(("reasoning", reasoning))
        text = ev.get("text")
        if text:
            text = self._content(text)
            if text:
                self.sent["content"] += text
                out.append(("content", text))
        return out

    def finish(self, result):
        reasoning, content, calls = split_reasoning(result)
        out = []
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
