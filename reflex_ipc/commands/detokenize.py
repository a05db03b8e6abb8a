"""reflex detokenize: the text of token ids with the model's tokenizer (no weights
loaded); the protocol's detokenize, the inverse of `reflex tokenize`."""

import sys

SKIP = ("token_ids", "device")
FLAGS = {"special": ["--special"]}

EXAMPLES = """\
  reflex detokenize 19556 905                  (-> Hello world, with the default model)
  echo "[19556, 905]" | reflex detokenize      (ids from stdin: a JSON list works too)
  reflex detokenize --special 1 19556 2        (-> <|im_start|>Hello<|im_end|>)"""


def add_arguments(p):
    from ..ops.detokenize import Request
    from ._args import Layout, add_options

    layout = Layout(p)
    layout.add("input", "ids", nargs="*", metavar="ID",
               help="token ids (commas or spaces between them); none: read them from stdin")
    add_options(layout, Request, skip=SKIP, flags=FLAGS, helps={
        "model": "GGUF path or alias; default: $REFLEX_MODEL, else smollm2",
        "special": "render control tokens (e.g. <|im_end|>) as their text; default: dropped"})
    layout.add("output", "--json", action="store_true", help='one JSON object: {"text": ...}')
    layout.done()


def parse_ids(words) -> list:
    """The ids of the given words (or of stdin's text): integers split by spaces/commas."""
    from ..errors import ReflexError
    from ._args import read_text

    text = " ".join(words) if words else read_text(None, "ID")
    out = []
    for w in text.replace(",", " ").replace("[", " ").replace("]", " ").split():
        try:
            out.append(int(w))
        except ValueError:
            raise ReflexError("invalid_request", f"ID: {w!r} is not a token id (an integer)") from None
    if not out:
        raise ReflexError("invalid_request", "ID: no token ids given")
    return out


def run(args) -> int:
    from ..errors import ReflexError
    from ..ops import detokenize
    from ._args import request

    ids = parse_ids(args.ids)
    req = request(detokenize.Request, args, {"token_ids": ids}, skip=SKIP, flags=FLAGS,
                  names={"token_ids": "ID"})

    from ..gguffile import GGUFFile
    from ..modelpath import resolve_model
    from ..tokenizer import load_tokenizer
    from ._model import write_json

    f = GGUFFile(resolve_model(req.model))
    tok = load_tokenizer(f)
    n_vocab = f.metadata["tokenizer.ggml.tokens"].count if "tokenizer.ggml.tokens" in f.metadata else None
    for i, t in enumerate(req.token_ids):
        if n_vocab is not None and t >= n_vocab:
            raise ReflexError("invalid_request", f"ID {t} (position {i + 1}) is out of range: "
                                                 f"the vocabulary has {n_vocab} tokens")
    text = tok.decode(list(req.token_ids), special=req.special)
    if args.json:
        write_json({"text": text, "token_ids": list(req.token_ids)})
    else:
        sys.stdout.write(text + "\n")
    return 0
