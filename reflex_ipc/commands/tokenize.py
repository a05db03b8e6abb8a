"""reflex tokenize: token ids of each TEXT with the model's tokenizer."""

import json
import sys


def add_arguments(p):
    p.add_argument("--model", help="GGUF path or alias (default: $REFLEX_MODEL, else smollm2)")
    p.add_argument("--no-special", action="store_true",
                   help="treat special-token text (e.g. <|im_end|>) as plain text")
    p.add_argument("--bos", action="store_true", help="prepend the BOS token")
    p.add_argument("--json", action="store_true",
                   help='one line per TEXT: {"text": ..., "ids": [...]}')
    p.add_argument("text", nargs="+", metavar="TEXT")


def run(args) -> int:
    import numpy  # noqa: F401  (needed anyway; loaded first, GGUFFile walks the vocab with it)

    from ..gguffile import GGUFFile
    from ..modelpath import resolve_model
    from ..tokenizer import load_tokenizer

    f = GGUFFile(resolve_model(args.model))
    tok = load_tokenizer(f)
    out = sys.stdout
    for text in args.text:
        ids = tok.encode(text, add_bos=args.bos, parse_special=not args.no_special)
        if args.json:
            out.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
            continue
        out.write(f"{json.dumps(text, ensure_ascii=False)}: {len(ids)} tokens\n")
        for i in ids:
            piece = tok.token_bytes(i)
            try:
                shown = json.dumps(piece.decode("utf-8"), ensure_ascii=False)
            except UnicodeDecodeError:
                shown = "bytes " + piece.hex(" ")
            mark = "  (control)" if tok.is_control(i) else ""
            out.write(f"  {i:>8}  {shown}{mark}\n")
    return 0
