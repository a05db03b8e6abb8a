"""reflex inspect: architecture, hyperparameters, tensors of a GGUF file."""

import sys

from ..ggml_types import type_name


EXAMPLES = """\
  reflex inspect model.gguf
  reflex inspect                                  (the default model)
  reflex inspect --json model.gguf | python -m json.tool"""


def add_arguments(p):
    p.add_argument("file", nargs="?", metavar="FILE",
                   help="the GGUF file (or an alias); default: --model, else $REFLEX_MODEL, else smollm2")
    p.add_argument("--model", metavar="MODEL", help="the same as FILE (as the other commands take it)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def summary(f) -> dict:
    from ..gguffile import ArrayValue

    arch = f.architecture
    hparams = {}
    prefix = f"{arch}."
    for k, v in f.metadata.items():
        if k.startswith(prefix) and not isinstance(v, ArrayValue):
            hparams[k[len(prefix):]] = v
        elif k.startswith(prefix):
            hparams[k[len(prefix):]] = v.tolist() if v.count <= 64 else f"[{v.count} values]"
    by_type: dict = {}
    for t in f.tensors.values():
        e = by_type.setdefault(type_name(t.ggml_type), {"tensors": 0, "bytes": 0})
        e["tensors"] += 1
        e["bytes"] += t.nbytes
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    vocab = tokens.count if isinstance(tokens, ArrayValue) else f.get(f"{arch}.vocab_size")
    return {
        "path": f.path,
        "gguf_version": f.version,
        "architecture": arch,
        "name": f.get("general.name"),
        "file_bytes": f.size,
        "tensor_count": len(f.tensors),
        "tensor_bytes": sum(t.nbytes for t in f.tensors.values()),
        "bytes_by_type": by_type,
        "vocab_size": vocab,
        "tokenizer_model": f.get("tokenizer.ggml.model"),
        "tokenizer_pre": f.get("tokenizer.ggml.pre"),
        "hparams": hparams,
    }


def run(args):
    from ..errors import ReflexError
    from ..gguffile import GGUFFile
    from ..modelpath import resolve_model

    if args.file and args.model and args.file != args.model:
        raise ReflexError("invalid_request", "give the file once: FILE or --model, not both")
    with GGUFFile(resolve_model(args.file or args.model)) as f:
        s = summary(f)
    if args.json:
        import orjson

        sys.stdout.buffer.write(orjson.dumps(s) + b"\n")
        return 0
    out = sys.stdout
    out.write(f"{s['path']}\n")
    out.write(f"  GGUF v{s['gguf_version']}, {s['file_bytes']:,} bytes\n")
    out.write(f"  architecture  {s['architecture']}  ({s['name']})\n")
    out.write(f"  tokenizer     {s['tokenizer_model']} / {s['tokenizer_pre']}, vocab_size {s['vocab_size']}\n")
    out.write(f"  tensors       {s['tensor_count']}, {s['tensor_bytes']:,} bytes\n")
    for name, e in sorted(s["bytes_by_type"].items(), key=lambda kv: -kv[1]["bytes"]):
        out.write(f"    {name:<8} {e['tensors']:>5} tensors {e['bytes']:>14,} bytes\n")
    out.write("  hyperparameters\n")
    for k, v in s["hparams"].items():
        out.write(f"    {k} = {v}\n")
    return 0
