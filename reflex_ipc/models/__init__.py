"""One module per architecture (the GGUF `general.architecture`), written against backend ops."""

from ..errors import ReflexError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "qwen35", "qwen35moe", "granitehybrid")
# Architectures whose ops (backends.base.RECURRENT_OPS) only the numpy backend has so far: device
# "auto" runs them on the CPU; an explicit CUDA device refuses them (unsupported_architecture).
CPU_ONLY = ("qwen35", "qwen35moe", "granitehybrid")


def load_model(ops, f):
    """The Model for GGUFFile f, its weights checked and loaded through backend `ops`."""
    import importlib

    arch = f.architecture
    if arch not in ARCHITECTURES:
        raise ReflexError("unsupported_architecture",
                          f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    return importlib.import_module(f".{arch}", __name__).Model(ops, f)
