"""A model's own sampling defaults: the GGUF's `general.sampling.*` keys (written by
llama.cpp's converter from a model's generation_config.json), as llama.cpp's server uses
them for a request that leaves a parameter out.

`sampling_defaults(f)` maps the keys the engine has a parameter for onto the protocol's
names; the rest (mirostat, XTC, the sampler sequence) are left out. `reflex http` applies
them to a request without those fields (front/api.py); the protocol's own defaults stay
greedy, so a JSON-lines request means the same on every model.
"""

# GGUF key -> (protocol parameter, type)
KEYS = {
    "general.sampling.temp": ("temperature", float),
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
    "general.sampling.penalty_last_n": ("repeat_last_n", int),
}
# the protocol's ranges (ops/generate.py): a value outside is ignored, never an error at load
RANGES = {"temperature": (0.0, 100.0), "top_k": (0, 2**63 - 1), "top_p": (1e-12, 1.0),
          "min_p": (0.0, 1.0), "repeat_penalty": (1e-12, 100.0), "repeat_last_n": (0, 1048576)}


def sampling_defaults(f) -> dict:
    """{protocol parameter: value} of the GGUF's general.sampling.* keys (f: a GGUFFile)."""
    out = {}
    for key, (name, tp) in KEYS.items():
        v = f.metadata.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        v = tp(v)
        lo, hi = RANGES[name]
        if lo <= v <= hi:
            out[name] = round(v, 6) if tp is float else v
    return out
