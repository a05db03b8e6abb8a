"""Saved states on a Runner: the model's state written to a file and read back
(runtime/statefile.py has the format, protocol/STATE.md the spec), checked against the
runner's model, adapters, context and state layout."""

from __future__ import annotations

import time

from .errors import ReflexError


def _ms(t0, t1=None):
    return round(((time.perf_counter() if t1 is None else t1) - t0) * 1e3, 3)


def identity(runner):
    """(model digest, adapter digest) that a saved state must carry to load here."""
    if runner._identity is None:
        from .runtime.statefile import adapter_digest, model_digest

        runner._identity = (model_digest(runner.f), adapter_digest(runner.adapters))
    return runner._identity


def save(runner, path) -> dict:
    """Write the state's tokens and arrays to `path` (atomically replaced). Returns
    {"path", "n_tokens", "bytes", "timings": {"state_save"}}."""
    from .runtime import statefile

    t0 = time.perf_counter()
    path = statefile.resolve_path(path)
    st = runner.exec.state
    if st is None or not st.tokens:
        raise ReflexError("invalid_request", "the state holds no tokens to save")
    tokens, arrays = st.snapshot()
    layers = [(spec.kind, [(name, arrays[i][name], spec.slot_axis(name) if spec.kind == "slot" else None)
                           for name in spec.arrays]) for i, spec in enumerate(st.specs)]
    digest, adig = identity(runner)
    size = statefile.write_state(path, digest=digest, adapters_digest=adig, arch=runner.model.hp.arch,
                                 tokens=tokens, layers=layers)
    return {"path": path, "n_tokens": len(tokens), "bytes": size, "timings": {"state_save": _ms(t0)}}


def open_checked(runner, path):
    """A StateFile checked against the runner: structure (state_error) and identity,
    context and layout (invalid_request naming the mismatch)."""
    from .runtime import statefile

    sf = statefile.StateFile(statefile.resolve_path(path))
    try:
        check(runner, sf)
    except BaseException:
        sf.close()
        raise
    return sf


def check(runner, sf, segment=False):
    """sf against the runner (segment: a prefix-store segment, which may start past 0)."""
    import os

    def bad(msg):
        return ReflexError("invalid_request", f"{sf.path}: {msg}")

    arch = runner.model.hp.arch
    if sf.arch != arch:
        raise bad(f"the state was saved by a {sf.arch!r} model; this model's architecture is {arch!r}")
    digest, adig = identity(runner)
    if sf.digest != digest:
        raise bad(f"the state was saved by another model (model digest {sf.digest.hex()[:16]}, "
                  f"{os.path.basename(runner.path)} has {digest.hex()[:16]})")
    if sf.adapters_digest != adig:
        raise bad("the state was saved with other LoRA adapters or scales than this model has loaded")
    if sf.start and not segment:
        raise bad(f"the file holds the state of tokens from position {sf.start} on (a prefix "
                  "store segment), not a state to start from")
    if sf.start + sf.n_tokens > runner.n_ctx:
        raise bad(f"the state holds {sf.start + sf.n_tokens} tokens; n_ctx {runner.n_ctx} is too small")
    specs = runner.model.state_spec()
    if len(specs) != len(sf.layers):
        raise bad(f"{len(sf.layers)} layers of state; the model has {len(specs)}")
    for i, (spec, (kind, arrays)) in enumerate(zip(specs, sf.layers)):
        names = [e.name for e in arrays]
        if kind != spec.kind or sorted(names) != sorted(spec.arrays):
            raise bad(f"layer {i}: {kind} state {names}; the model keeps {spec.kind} state "
                      f"{sorted(spec.arrays)}")
        for e in arrays:
            want = spec.shape(e.name, sf.n_tokens) if kind == "slot" else spec.shape(e.name, 1)[1:]
            axis = spec.slot_axis(e.name) if kind == "slot" else None
            if tuple(e.shape) != tuple(want) or e.slot_axis != axis:
                raise bad(f"layer {i} array {e.name!r}: shape {e.shape}; the model's is {want}")
    if sf.tokens and max(sf.tokens) >= runner.n_vocab:
        raise ReflexError("state_error", f"{sf.path}: token id {max(sf.tokens)} is outside the vocabulary")


def restore(runner, sf, room=0):
    """Make the executor's state hold the saved tokens and arrays, with room for `room`
    more tokens (so that the request that follows needs no larger state)."""
    ex = runner.exec
    loaded = sf.load(runner.ops)  # read and checked first: a bad file leaves the state as it was
    ex.forget()
    st = ex.reserve(max(sf.n_tokens + room, 1))
    sf.restore(st, loaded=loaded)


def load(runner, path) -> dict:
    """Load a saved state (the next request whose tokens start with its tokens evaluates
    only the rest). Returns {"path", "n_tokens", "timings": {"state_load"}}."""
    t0 = time.perf_counter()
    with open_checked(runner, path) as sf:
        restore(runner, sf)
        return {"path": sf.path, "n_tokens": sf.n_tokens, "timings": {"state_load": _ms(t0)}}
