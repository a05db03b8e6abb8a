"""reflex generate: continue a prompt (greedy by default), or answer it as a chat turn;
the protocol's generate."""

import sys

# one request per process: nothing to reuse, nothing to stream; the chat and constraint
# fields have the hand-written options below
SKIP = ("prompt", "stream", "cache_prompt", "messages", "tools", "chat_template",
        "chat_template_kwargs", "add_generation_prompt", "json_schema", "grammar")
NAMES = {"prompt": "PROMPT", "messages": "PROMPT", "json_schema": "--json-schema",
         "grammar": "--grammar", "chat_template": "--chat-template"}
FLAGS = {"kv_import": ["--import-kv"], "kv_export": ["--export-kv"]}

EXAMPLES = """\
  reflex generate --chat "Name the three primary colors."
  reflex generate --chat --system "Answer in one word." "Which planet is known as the red planet?"
  reflex generate --max-tokens 8 "The capital of France is"      (plain continuation)
  reflex generate --temperature 0.7 --seed 1 "Once upon a time"
  reflex generate --json --logprobs 3 --max-tokens 4 "The capital of France is"
  reflex generate --chat < question.txt                           (PROMPT from stdin)
A chat (instruct) model such as the default answers a question with --chat; without it
the text is continued as it stands, which may end at once (an empty answer)."""


def add_chat_arguments(layout):
    layout.add("input", "--chat", action="store_true",
               help="send PROMPT as a user message through the model's chat template "
                    "(a chat model answers; without it the text is continued)")
    layout.add("input", "--system", metavar="TEXT", help="with --chat: a system message first")
    layout.add("input", "--chat-template", metavar="JINJA",
               help="with --chat: this template instead of the GGUF's (text, or @FILE)")


def add_constraint_arguments(layout):
    layout.add("constraints", "--json-schema", metavar="SCHEMA",
               help="constrain the output to this JSON Schema (JSON text, or @FILE; needs the "
                    "constrain extra)")
    layout.add("constraints", "--grammar", metavar="LARK",
               help="constrain the output to this Lark grammar (text, or @FILE)")


def add_arguments(p):
    from ..ops.generate import Request
    from ._args import PROMPT_HELP, Layout
    from ._model import add_common

    layout = Layout(p)
    layout.add("input", "prompt", nargs="?", metavar="PROMPT", help=PROMPT_HELP)
    add_chat_arguments(layout)
    add_common(layout, Request, skip=SKIP, flags=FLAGS, helps={
        "stop": "stop string (repeatable)",
        "logit_bias": "TOKEN_ID=BIAS: add BIAS (-100..100) to that token's logit (repeatable)",
        "dry_sequence_breakers": "DRY: a repetition never reaches back past this string "
                                 "(repeatable; default: newline, ':', '\"', '*')",
        "n": "choices, generated one after another from the prompt's state (printed one "
             "after another); 1 <= n <= 128; default: 1",
        "enable_thinking": "with --chat: the chat template's thinking switch (Qwen3-style "
                           "templates); default: the template's",
        "logprobs": "each token's log-probability and the N most likely (0 <= n <= 20): "
                    "fields of the --json result; without --json a table on stderr"})
    add_constraint_arguments(layout)
    layout.done()


def read_arg(value):
    """TEXT, or the contents of FILE for @FILE."""
    if value is not None and value.startswith("@"):
        with open(value[1:], encoding="utf-8") as fh:
            return fh.read()
    return value


def chat_fields(args, text, text_field="prompt") -> dict:
    """The request's text field, or with --chat its messages (and --chat-template)."""
    from ..errors import ReflexError

    if not args.chat:
        for opt in ("system", "chat_template", "enable_thinking"):
            if getattr(args, opt, None) is not None:
                raise ReflexError("invalid_request",
                                  f"--{opt.replace('_', '-')} needs --chat")
        return {text_field: text}
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": text})
    out = {"messages": messages}
    if getattr(args, "chat_template", None) is not None:
        out["chat_template"] = read_arg(args.chat_template)
    return out


def constraint_fields(args) -> dict:
    from ..errors import ReflexError

    out = {}
    if args.json_schema is not None:
        import json

        try:
            out["json_schema"] = json.loads(read_arg(args.json_schema))
        except ValueError as e:
            raise ReflexError("invalid_request", f"--json-schema: not JSON: {e}") from None
    if args.grammar is not None:
        out["grammar"] = read_arg(args.grammar)
    return out


def run(args):
    from .. import phases
    from ..ops import generate
    from ._args import read_text, request
    from ._model import finish, load, run_op

    given = {**chat_fields(args, read_text(args.prompt)), **constraint_fields(args)}
    req = request(generate.Request, args, given, skip=SKIP, flags=FLAGS, names=NAMES)
    model, req = load(args, req)
    first = []
    shown = [0]  # the choice being printed

    def on_token(token_id, text, index=0, reasoning_content="", **_):
        if not first:
            first.append(phases.mark("first_token"))
        if args.json:
            return
        if index != shown[0]:  # the next choice: on a line of its own
            shown[0] = index
            sys.stdout.write("\n")
        if reasoning_content:  # a reasoning model's <think> block: beside the answer
            sys.stderr.write(reasoning_content)
            sys.stderr.flush()
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()

    out = run_op(model, lambda: model.generate(req, on_token=on_token))
    if not finish(model, out, args.json):
        sys.stdout.write("\n")
        sys.stdout.flush()
        if out.get("logprobs"):
            write_logprobs(out["logprobs"])
        if not args.chat and not out["text"].strip() and out["finish_reason"] == "stop" \
                and model.runner.f.get("tokenizer.chat_template"):
            sys.stderr.write(f"reflex {args.command}: note: the model ended its answer before any text. "
                             "It is a chat model: --chat sends PROMPT as a user message through its "
                             "chat template, which is how it answers a question or an instruction\n")
        t = out["timings"]
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} generated, "
                         f"finish {out['finish_reason']}; load {t['load']:.0f} ms, prompt "
                         f"{t['prompt_eval']:.0f} ms, decode {t['decode']:.0f} ms"
                         + (f" ({t['decode_tokens_per_s']:.1f} tok/s)" if t.get("decode_tokens_per_s") else "")
                         + f", backend {model.runner.ops.name}]\n")
    return 0


def write_logprobs(entries, out=None):
    """--logprobs without --json: each generated token, its log-probability and the most
    likely tokens at that step, as a table on stderr (stdout keeps the text alone)."""
    out = out or sys.stderr
    out.write("logprobs (natural log; the most likely tokens at each step):\n")
    width = max(len(repr(e["text"])) for e in entries)
    for e in entries:
        top = "  ".join(f"{t['text']!r} {t['logprob']:.3f}" for t in e.get("top") or [])
        out.write(f"  {e['text']!r:<{width}}  {e['logprob']:8.3f}" + (f"   | {top}" if top else "") + "\n")
