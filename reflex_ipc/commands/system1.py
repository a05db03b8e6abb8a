"""reflex system1: score candidate continuations of a prompt in one forward pass."""

import sys


def add_arguments(p):
    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                   help="apply a LoRA adapter (llama.cpp's GGUF adapter format) at load, scaled "
                   "by SCALE (default 1); repeatable")
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: min(train, 4096))")
    p.add_argument("--temperature", type=float, default=1.0, help="for the candidate probabilities")
    p.add_argument("--candidate", action="append", required=True, help="a continuation (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--export-kv", metavar="FILE", help="save the state after the prompt to FILE "
                   "(protocol/STATE.md), then go on")
    p.add_argument("--import-kv", metavar="FILE", help="start from the state saved in FILE; PROMPT is "
                   "then the text after its tokens (may be left out)")
    p.add_argument("prompt", nargs="?")


def run(args):
    from ._model import finish, load

    if args.prompt is None:
        if args.import_kv is None:
            sys.stderr.write(f"reflex {args.command}: a PROMPT is needed (or --import-kv FILE)\n")
            return 2
        args.prompt = ""
    runner = load(args)
    out = runner.system1(args.prompt, args.candidate, temperature=args.temperature,
                         kv_import=args.import_kv, kv_export=args.export_kv)
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
