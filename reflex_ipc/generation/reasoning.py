"""Reasoning blocks: the text of a `<think> ... </think>` block that reasoning models
(Qwen3, DeepSeek-R1, ...) write before their answer, separated from the answer as
llama.cpp's server does (`reasoning_content` beside the content).

The block counts when it opens the output (after optional whitespace), or when the
prompt left it open (a chat template that ends the generation prompt with `<think>`).
The reasoning is stripped of the whitespace around it, the content of the whitespace
that follows the block; a later `<think>` is content. The splitter works on the text
as the stop matcher releases it, so a stream's pieces join to the same two texts as
the result's.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def think_tokens(tok):
    """(start tag ids, end tag ids) when the vocabulary has <think> and </think> as tokens
    of their own (a reasoning model), else None."""
    a, b = tok.find_text(OPEN), tok.find_text(CLOSE)
    if a < 0 or b < 0:
        return None
    return [a], [b]


def opens_block(ids, think) -> bool:
    """Whether token ids (a prompt) end inside a reasoning block: its last start tag comes
    after its last end tag."""
    if think is None:
        return False
    (a,), (b,) = think

    def last(t):
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] == t:
                return i
        return -1

    return last(a) > last(b)


def _partial(text, tag) -> int:
    """The length of the longest tail of text that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningSplitter:
    def __init__(self, open_=False):
        self.state = "reasoning" if open_ else "start"
        self.lead = True  # the reasoning's leading whitespace is still to drop
        self.buf = ""  # text held back

    def push(self, text):
        """(content, reasoning) that became final with this text."""
        content = reasoning = ""
        buf = self.buf + text
        self.buf = ""
        while buf:
            if self.state == "start":
                s = buf.lstrip()
                if s.startswith(OPEN):
                    buf, self.state = s[len(OPEN):], "reasoning"
                elif s and not OPEN.startswith(s):
                    content, buf, self.state = content + buf, "", "content"
                else:  # only whitespace, or the start of the tag so far
                    self.buf = buf
                    break
            elif self.state == "reasoning":
                if self.lead:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    self.lead = False
                i = buf.find(CLOSE)
                if i >= 0:
                    reasoning += buf[:i].rstrip()
                    buf, self.state = buf[i + len(CLOSE):], "after"
                    continue
                keep = _partial(buf, CLOSE)
                body = buf[:len(buf) - keep]
                stripped = body.rstrip()
                reasoning += stripped
                self.buf = body[len(stripped):] + buf[len(buf) - keep:]
                break
            elif self.state == "after":
                buf = buf.lstrip()
                if buf:
                    self.state = "content"
            else:
                content, buf = content + buf, ""
        return content, reasoning

    def finish(self):
        """(content, reasoning) held back when the text ended."""
        buf, self.buf = self.buf, ""
        if self.state == "start":
            return buf, ""
        if self.state == "reasoning":
            return "", buf.rstrip() if not self.lead else ""
        return "", ""
