"""Synthetic LoRA adapters in llama.cpp's GGUF adapter format, for a given base GGUF.

    python3 -m reflex_ipc.testing.lora BASE.gguf OUT.gguf [--rank 4] [--alpha 8] [--seed 1]
                                 [--targets attn_q,attn_v,ffn_up,output]

general.type = adapter, adapter.type = lora, adapter.lora.alpha, and for each target base
matrix NAME a pair NAME.lora_a (numpy [rank, n_in]) and NAME.lora_b (numpy [n_out, rank]),
F32, random (seeded: the same arguments write the same bytes). The low-rank product is
scaled to about half the base weight's spread so that it changes greedy
continuations without swamping the model. Used by tests/test_lora.py,
scripts/gpu/gpu_check_state.py and scripts/fixtures/record_lora_goldens.py.
"""

import argparse
import sys

import numpy as np

DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(base, out, *, rank=4, alpha=8.0, seed=1, targets=DEFAULT_TARGETS, arch=None):
    """Write an adapter for the base GGUF at `base` to `out`; returns out. targets: weight
    name parts ("attn_q", ... or "output" for output.weight). arch overrides the base's
    architecture (to make mismatching adapters)."""
    import gguf

    from ..gguffile import GGUFFile
    from ..quants import dequantize

    rng = np.random.default_rng(seed)
    with GGUFFile(base) as f:
        w = gguf.GGUFWriter(out, arch or f.architecture)
        w.add_string("general.type", "adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", float(alpha))
        names = [n for n, t in f.tensors.items() if len(t.shape) == 2 and n != "token_embd.weight"
                 and any(n == f"{tg}.weight" or n.endswith(f".{tg}.weight") for tg in targets)]
        for n in names:
            t = f.tensors[n]
            n_in, n_out = int(t.shape[0]), int(t.shape[1])
            std = float(np.std(dequantize(f.tensor_data(t), t.ggml_type, t.n_elements)))
            a = rng.standard_normal((rank, n_in))
            # c = alpha / rank (or 1): c B A then has entries of about 0.5 * std
            c = alpha / rank if alpha else 1.0
            b = rng.standard_normal((n_out, rank)) * (0.5 * std / c / np.sqrt(rank))
            w.add_tensor(f"{n}.lora_a", a.astype(np.float32))
            w.add_tensor(f"{n}.lora_b", b.astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("out")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--alpha", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS))
    a = p.parse_args(argv)
    write_lora(a.base, a.out, rank=a.rank, alpha=a.alpha, seed=a.seed, targets=a.targets.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
