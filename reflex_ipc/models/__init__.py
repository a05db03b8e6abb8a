"""One module per architecture (the GGUF `general.architecture`), written against backend ops."""

from ..errors import ReflexError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "deepseek2", "gemma4",
                 "qwen35", "qwen35moe", "granitehybrid")
# Architectures whose ops (backends.base.MLA_OPS) only the numpy backend has so far: device "auto"
# runs them there; an explicit cpu or cuda device refuses them (unsupported_architecture, naming
# the missing ops).
NUMPY_ONLY = ("deepseek2",)
# Architectures whose ops (backends.base.RECURRENT_OPS) the numpy and CUDA backends have but the C
# cpu backend lacks: device "auto" runs them on CUDA where it is usable, else on numpy.
NO_CPU = ("qwen35", "qwen35moe", "granitehybrid")
# Architectures the CUDA backend refuses (its results do not match the oracle yet): device "auto"
# runs them on the cpu backend.
NO_CUDA = ("gemma4",)


def load_model(ops, f, lora=None):
    """The Model for GGUFFile f, its weights checked and loaded through backend `ops`, with
    LoRA adapters (a reflex_ipc.lora.LoraSet) applied when given."""
    import importlib

    arch = f.architecture
    if arch not in ARCHITECTURES:
        raise ReflexError("unsupported_architecture",
                          f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    model = importlib.import_module(f".{arch}", __name__).Model(ops, f, lora)
    if lora is not None:
        lora.check_used()
        if lora.runtime:  # low-rank terms added at run time: the model's matmuls go through LoraOps
            from ..lora import LoraOps

            model.ops = LoraOps(ops)
    return model
