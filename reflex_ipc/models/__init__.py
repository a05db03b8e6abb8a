"""One module per architecture (the GGUF `general.architecture`), written against backend ops."""

from ..errors import ReflexError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3")


def load_model(ops, f):
    """The Model for GGUFFile f, its weights checked and loaded through backend `ops`."""
    import importlib

    arch = f.architecture
    if arch not in ARCHITECTURES:
        raise ReflexError("unsupported_architecture",
                          f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    return importlib.import_module(f".{arch}", __name__).Model(ops, f)
