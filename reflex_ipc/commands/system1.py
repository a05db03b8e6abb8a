"""reflex system1: score candidate continuations of a prompt in one forward pass."""

import sys


def add_arguments(p):
    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: min(train, 4096))")
    p.add_argument("--temperature", type=float, default=1.0, help="for the candidate probabilities")
    p.add_argument("--candidate", action="append", required=True, help="a continuation (repeatable)")
    p.add_argument("--chat", action="store_true",
                   help="send PROMPT as a user message through the model's chat template; "
                        "the candidates continue the assistant's turn")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt; absent or '-': read from stdin")


def run(args):
    from ._model import finish, load
    from .generate import read_arg

    prompt = read_arg(args.prompt)
    runner = load(args)
    if args.chat:
        from ..prepare import chat_text

        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        prompt = chat_text(runner, messages)
    out = runner.system1(prompt, args.candidate, temperature=args.temperature)
    if finish(runner, out, args.json):
        return 0
    for i, c in enumerate(out["candidates"]):
        mark = "*" if i == out["best_idx"] else " "
        sys.stdout.write(f"{mark} {c['probability']:.4f}  logprob {c['logprob']:9.4f}  "
                         f"({len(c['token_ids'])} tokens)  {c['text']!r}\n")
    t = out["timings"]
    sys.stderr.write(f"[entropy {out['entropy']:.4f} bits; load {t['load']:.0f} ms, prompt "
                     f"{t['prompt_eval']:.0f} ms, candidates {t['candidates_eval']:.0f} ms, "
                     f"backend {runner.ops.name}]\n")
    return 0
