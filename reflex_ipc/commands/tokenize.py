"""reflex tokenize: token ids of each TEXT with the model's tokenizer (no weights loaded);
the protocol's tokenize."""

import json
import sys

SKIP = ("text", "device", "messages", "tools", "chat_template", "chat_template_kwargs",
        "enable_thinking", "add_generation_prompt")  # chat: the protocol's tokenize (or generate --chat)
FLAGS = {"add_bos": ["--bos", "--add-bos"], "parse_special": ["--no-special"]}
HELPS = {"add_bos": "prepend the BOS token",
         "parse_special": "treat special-token text (e.g. <|im_end|>) as plain text",
         "model": "GGUF path or alias; default: $REFLEX_MODEL, else smollm2"}


EXAMPLES = """\
  reflex tokenize "Hello <|im_end|>"              (each token: id, text, control or not)
  reflex tokenize --json --bos "Hello" "world"
  reflex tokenize --model model.gguf < file.txt
  reflex detokenize 19556 2         (the inverse)"""


def add_arguments(p):
    from ..ops.tokenize import Request
    from ._args import Layout, add_options

    layout = Layout(p)
    layout.add("input", "text", nargs="*", metavar="TEXT",
               help="the texts; '-' or none: one text read from stdin")
    add_options(layout, Request, skip=SKIP, flags=FLAGS, helps=HELPS)
    layout.add("output", "--json", action="store_true",
               help='one line per TEXT: {"text": ..., "token_ids": [...]}')
    layout.done()


def run(args) -> int:
    from ..ops import tokenize
    from ._args import read_text, request

    texts = [read_text(t, "TEXT") if t == "-" else t for t in args.text] or [read_text(None, "TEXT")]
    reqs = [request(tokenize.Request, args, {"text": t}, skip=SKIP, flags=FLAGS) for t in texts]

    import numpy  # noqa: F401  (needed anyway; loaded first, GGUFFile walks the vocab with it)

    from ..gguffile import GGUFFile
    from ..modelpath import resolve_model
    from ..tokenizer import load_tokenizer
    from ._model import write_json

    f = GGUFFile(resolve_model(reqs[0].model))
    tok = load_tokenizer(f)
    out = sys.stdout
    for req in reqs:
        ids = tok.encode(req.text, add_bos=req.add_bos, parse_special=req.parse_special)
        if args.json:
            out.flush()
            write_json({"text": req.text, "token_ids": ids})
            continue
        out.write(f"{json.dumps(req.text, ensure_ascii=False)}: {len(ids)} tokens\n")
        for i in ids:
            piece = tok.token_bytes(i)
            try:
                shown = json.dumps(piece.decode("utf-8"), ensure_ascii=False)
            except UnicodeDecodeError:
                shown = "bytes " + piece.hex(" ")
            mark = "  (control)" if tok.is_control(i) else ""
            out.write(f"  {i:>8}  {shown}{mark}\n")
    return 0
