"""reflex generate: continue a prompt (greedy by default)."""

import sys


def add_arguments(p):
    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto", "numpy"])
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: min(train, 4096))")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("prompt")


def run(args):
    from .. import phases
    from ._model import finish, load

    runner = load(args)
    first = []

    def on_token(token_id, text):
        if not first:
            first.append(phases.mark("first_token"))
        if not args.json and text:
            sys.stdout.write(text)
            sys.stdout.flush()

    out = runner.generate(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          stop=args.stop, on_token=on_token)
    if not finish(runner, out, args.json):
        sys.stdout.write("\n")
        t = out["timings"]
        sys.stderr.write(f"[{out['prompt_tokens']} prompt tokens, {out['completion_tokens']} generated, "
                         f"finish {out['finish_reason']}; load {t['load']:.0f} ms, prompt "
                         f"{t['prompt_eval']:.0f} ms, decode {t['decode']:.0f} ms"
                         + (f" ({t['decode_tokens_per_s']:.1f} tok/s)" if t.get("decode_tokens_per_s") else "")
                         + f", backend {runner.ops.name}]\n")
    return 0
