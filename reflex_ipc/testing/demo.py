"""Files to try `reflex infill` and `--lora` with when you have no FIM model or adapter.

    python -m reflex_ipc.testing.demo fim OUT.gguf
        a tiny model (random weights, SmolLM2's vocabulary plus Qwen2.5-Coder's FIM tokens):
        `reflex infill --model OUT.gguf --prefix ... --suffix ...` runs end to end; being
        untrained, its text is noise. For real infilling use a model trained for it, e.g.
        Qwen2.5-Coder-0.5B in GGUF from Hugging Face (no package registry ships one).
    python -m reflex_ipc.testing.demo lora OUT.gguf [--base MODEL] [--rank 4] [--seed 1]
        a small random LoRA adapter (llama.cpp's GGUF adapter format) for MODEL (a path or
        alias; default: the default model): `reflex generate --lora OUT.gguf:0.5 ...` then
        changes the model's greedy text. Real adapters are trained (e.g. with PEFT) and
        converted with llama.cpp's convert_lora_to_gguf.py.

Both need the `gguf` package (`pip install gguf`; the test extra has it). Never imported by
the runtime.
"""

import argparse
import os
import sys
import tempfile


def fim_model(out: str) -> str:
    from ..modelpath import resolve_model
    from . import vocab as vg
    from .synthetic import parity_model

    with tempfile.TemporaryDirectory() as d:
        vocab = os.path.join(d, "vocab.gguf")
        vg.vocab_gguf(vocab, vg.FIM_QWEN, src=resolve_model("smollm2"))
        parity_model("llama", out, vocab_paths={"gpt2": vocab})
    return out


def lora_adapter(out: str, base=None, rank=4, seed=1) -> str:
    from ..modelpath import resolve_model
    from .lora import write_lora

    return write_lora(resolve_model(base), out, rank=rank, seed=seed,
                      targets=("attn_q", "attn_v", "ffn_up"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reflex_ipc.testing.demo",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("fim", help="a tiny untrained model with fill-in-the-middle tokens")
    p.add_argument("out", metavar="OUT.gguf")
    p = sub.add_parser("lora", help="a small random LoRA adapter for a model")
    p.add_argument("out", metavar="OUT.gguf")
    p.add_argument("--base", metavar="MODEL", help="GGUF path or alias (default: the default model)")
    p.add_argument("--rank", type=int, default=4, metavar="N")
    p.add_argument("--seed", type=int, default=1, metavar="N")
    a = ap.parse_args(argv)
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.exit("demo: this needs the gguf package: pip install gguf")
    if a.what == "fim":
        path = fim_model(a.out)
        print(f"{path}: try  reflex infill --model {path} --prefix $'def add(a, b):\\n    return ' "
              "--suffix $'\\n'  (an untrained model: the text is noise)")
    else:
        path = lora_adapter(a.out, a.base, a.rank, a.seed)
        print(f"{path}: try  reflex generate --lora {path}:0.5 \"Once upon a time\"  (and without "
              "--lora: the text differs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
