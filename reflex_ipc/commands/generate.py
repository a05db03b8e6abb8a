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


def add_chat_arguments(p):
    p.add_argument("--chat", action="store_true",
                   help="send PROMPT as a user message through the model's chat template")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--chat-template", metavar="JINJA",
                   help="with --chat: this template instead of the GGUF's (text, or @FILE)")


def add_constraint_arguments(p):
    p.add_argument("--json-schema", metavar="SCHEMA",
                   help="constrain the output to this JSON Schema (JSON text, or @FILE)")
    p.add_argument("--grammar", metavar="LARK",
                   help="constrain the output to this Lark grammar (text, or @FILE)")


def add_arguments(p):
    from ..ops.generate import Request
    from ._args import PROMPT_HELP
    from ._model import add_common

    add_common(p, Request, skip=SKIP, flags=FLAGS, helps={
        "stop": "stop string (repeatable)",
        "logit_bias": "TOKEN_ID=BIAS: add BIAS (-100..100) to that token's logit (repeatable)",
        "dry_sequence_breakers": "DRY: a repetition never reaches back past this string "
                                 "(repeatable; default: newline, ':', '\"', '*')",
        "n": "choices, generated one after another from the prompt's state (printed one "
             "after another); 1 <= n <= 128; default: 1",
        "enable_thinking": "with --chat: the chat template's thinking switch (Qwen3-style "
                           "templates); default: the template's",
        "logprobs": "with --json: each token's log-probability and the N most likely "
                    "(0 <= n <= 20)"})
    add_chat_arguments(p)
    add_constraint_arguments(p)
    p.add_argument("prompt", nargs="?", metavar="PROMPT", help=PROMPT_HELP)


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
        t = out["timings"]
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} generated, "
                         f"finish {out['finish_reason']}; load {t['load']:.0f} ms, prompt "
                         f"{t['prompt_eval']:.0f} ms, decode {t['decode']:.0f} ms"
                         + (f" ({t['decode_tokens_per_s']:.1f} tok/s)" if t.get("decode_tokens_per_s") else "")
                         + f", backend {model.runner.ops.name}]\n")
    return 0
