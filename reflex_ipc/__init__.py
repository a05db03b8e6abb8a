"""reflex-ipc: cold-start-first LLM inference over JSON lines.

`reflex_ipc.Model` is the in-process API (reflex_ipc/api.py); it is loaded on first use,
so `import reflex_ipc` imports nothing else.
"""

__version__ = "0.1.0"

_LAZY = {"Model": "api", "TokenStream": "api", "ReflexError": "errors"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'reflex_ipc' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_LAZY])
