"""One module per architecture (the GGUF `general.architecture`), written against backend ops."""

from ..errors import ReflexError

SHARED = ("common", "plan", "blocks")  # the modules every architecture shares; every other one is an architecture
# Architectures whose ops only the numpy backend has so far: device "auto" runs them there; an
# explicit cpu or cuda device refuses them (unsupported_architecture, naming the missing ops).
NUMPY_ONLY = ()
# Architectures whose ops the numpy and CUDA backends have but the C cpu backend lacks: device
# "auto" runs them on CUDA where it is usable, else on numpy. (The recurrent hybrids and deepseek2
# were here until the cpu backend gained backends.base.RECURRENT_OPS and MLA_OPS.)
NO_CPU = ()
# Architectures the CUDA backend refuses (its results do not match the oracle yet): device "auto"
# runs them on the cpu backend. (gemma4 was here until its CUDA mismatch was traced to a read of
# an arena weight before the upload finished, fixed in CudaOps.to_numpy.)
NO_CUDA = ()
CUDA_MAX_HEAD_DIM = 256  # backends.cuda_ops.ATT_MAX_HD: the CUDA attention kernel's widest head


def cuda_unfit(f):
    """Why the CUDA backend cannot run GGUFFile f although it has its architecture's ops, or
    None: gemma4's global layers with heads wider than the CUDA attention kernel takes (real
    Gemma 4 files have 512). Device "auto" runs such a file on the cpu backend."""
    a = f.architecture
    if a == "gemma4":
        widths = [f.get(f"{a}.attention.key_length"), f.get(f"{a}.attention.key_length_swa")]
        widest = max((int(w) for w in widths if w is not None and not isinstance(w, (list, str))), default=0)
        if widest > CUDA_MAX_HEAD_DIM:
            return f"gemma4 heads of {widest} dims (the CUDA attention takes at most {CUDA_MAX_HEAD_DIM})"
    return None


def __getattr__(name):
    """ARCHITECTURES: the supported architectures (the GGUF `general.architecture` values), the
    modules of this package but the shared ones: an architecture is one module (its name with
    "-" spelled "_": gpt-oss is gpt_oss.py)."""
    if name == "ARCHITECTURES":
        import os

        return tuple(sorted(f[:-3].replace("_", "-") for f in os.listdir(os.path.dirname(__file__))
                            if f.endswith(".py") and not f.startswith("_") and f[:-3] not in SHARED))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def module(arch):
    """The module of a supported architecture (gpt-oss: models/gpt_oss.py)."""
    import importlib

    return importlib.import_module(f".{arch.replace('-', '_')}", __name__)


def load_model(ops, f, lora=None):
    """The Model for GGUFFile f, its weights checked and loaded through backend `ops`, with
    LoRA adapters (a reflex_ipc.lora.LoraSet) applied when given."""
    arch = f.architecture
    supported = __getattr__("ARCHITECTURES")
    if arch not in supported:
        raise ReflexError("unsupported_architecture",
                          f"architecture {arch!r} is not supported (supported: {', '.join(supported)})")
    check_vocabulary(f)
    model = module(arch).Model(ops, f, lora)
    if lora is not None:
        lora.check_used()
        if lora.runtime:  # low-rank terms added at run time: the model's matmuls go through LoraOps
            from ..lora import LoraOps

            model.ops = LoraOps(ops)
    return model


# tensors with a row per token of the vocabulary (a padded vocabulary may have more rows)
VOCAB_ROWS = ("token_embd.weight", "output.weight", "per_layer_token_embd.weight")


def check_vocabulary(f):
    """gguf_error, before any weight loads, when the tokenizer's vocabulary does not fit the
    model: fewer tokens than `{arch}.vocab_size` says (a tokens array cut short), or a tensor
    with a row per token that has fewer rows than there are tokens (a token id would index
    past it: llama.cpp requires them equal, reflex lets a padded vocabulary have more).
    A file without tokenizer.ggml.tokens (model-level tests) is not checked here."""
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    n_tok = getattr(tokens, "count", None)
    if not isinstance(n_tok, int):
        return
    key = f"{f.architecture}.vocab_size"
    vs = f.metadata.get(key)
    if isinstance(vs, int) and not isinstance(vs, bool) and vs > n_tok:
        raise ReflexError("gguf_error", f"tokenizer.ggml.tokens has {n_tok} entries but metadata key {key} "
                                        f"says the vocabulary has {vs}")
    for name in VOCAB_ROWS:
        t = f.tensors.get(name)
        if t is not None and len(t.shape) >= 2 and int(t.shape[1]) < n_tok:
            raise ReflexError("gguf_error", f"tensor {name!r} has {int(t.shape[1])} rows for a vocabulary "
                                            f"of {n_tok} tokens")
