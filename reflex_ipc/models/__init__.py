"""One module per architecture (the GGUF `general.architecture`), written against backend ops."""

from ..errors import ReflexError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "deepseek2", "gemma4",
                 "qwen35", "qwen35moe", "granitehybrid")
# Architectures whose ops (backends.base.RECURRENT_OPS, MLA_OPS) the cpu backend lacks: device
# "auto" runs them on numpy (on CUDA when it is usable, for those also in CUDA_TOO); an explicit
# device without the ops refuses them (unsupported_architecture, naming the missing ops).
NUMPY_ONLY = ("qwen35", "qwen35moe", "granitehybrid", "deepseek2")
CUDA_TOO = ("deepseek2",)  # of NUMPY_ONLY: the CUDA backend has their ops (base.MLA_OPS)
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
