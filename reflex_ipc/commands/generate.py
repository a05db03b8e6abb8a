"""reflex generate: continue a prompt (greedy by default), or answer it as a chat turn."""

import sys


def add_arguments(p):
    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: min(train, 4096))")
    p.add_argument("--max-tokens", type=int, default=64)
    add_sampling(p)
    p.add_argument("--chat", action="store_true",
                   help="send PROMPT as a user message through the model's chat template")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--chat-template", metavar="JINJA", help="with --chat: this template instead "
                                                            "of the GGUF's")
    p.add_argument("--json-schema", metavar="SCHEMA",
                   help="constrain the output to this JSON Schema (JSON text, or @FILE)")
    p.add_argument("--regex", help="constrain the output to this regular expression")
    p.add_argument("--grammar", metavar="LARK", help="constrain the output to this Lark grammar "
                                                     "(text, or @FILE)")
    p.add_argument("--logprobs", type=int, metavar="N", default=None,
                   help="with --json: per token log-probability and the N most likely (0-20)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt; absent or '-': read from stdin (no size limit)")


def add_sampling(p):
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def read_arg(value):
    """TEXT, or the contents of FILE for @FILE, or stdin for None / '-'."""
    if value is None or value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        with open(value[1:], encoding="utf-8") as fh:
            return fh.read()
    return value


def sampling_kwargs(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                min_p=args.min_p, seed=args.seed, repeat_penalty=args.repeat_penalty,
                repeat_last_n=args.repeat_last_n, stop=args.stop)


def run(args):
    from .. import phases
    from ._model import finish, load

    prompt = read_arg(args.prompt)
    if args.system is not None and not args.chat:
        sys.stderr.write("reflex generate: --system needs --chat\n")
        return 2
    runner = load(args)
    first = []

    def on_token(token_id, text, **extra):
        if not first:
            first.append(phases.mark("first_token"))
        if not args.json and text:
            sys.stdout.write(text)
            sys.stdout.flush()

    from .. import prepare
    from ..errors import ReflexError

    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        prompt = prepare.chat_text(runner, messages, chat_template=args.chat_template)
    schema = None
    if args.json_schema is not None:
        import json

        try:
            schema = json.loads(read_arg(args.json_schema))
        except ValueError as e:
            raise ReflexError("invalid_request", f"`json_schema`: not JSON: {e}") from None
    extra = prepare.generate_extras(
        runner, logprobs=args.logprobs, json_schema=schema, regex=args.regex,
        grammar=read_arg(args.grammar) if args.grammar is not None else None)
    out = runner.generate(prompt, max_tokens=args.max_tokens, on_token=on_token,
                          **sampling_kwargs(args), **extra)
    if not finish(runner, out, args.json):
        sys.stdout.write("\n")
        t = out["timings"]
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} generated, "
                         f"finish {out['finish_reason']}; load {t['load']:.0f} ms, prompt "
                         f"{t['prompt_eval']:.0f} ms, decode {t['decode']:.0f} ms"
                         + (f" ({t['decode_tokens_per_s']:.1f} tok/s)" if t.get("decode_tokens_per_s") else "")
                         + f", backend {runner.ops.name}]\n")
    return 0
