"""Fixtures of the architecture tests: every architecture's examples (models/<arch>.py EXAMPLES,
reflex_ipc.testing.synthetic.example_gguf) written on first use, once per session (per xdist
worker: each has its own temporary folder), and runners and llama.cpp instances shared within
a session."""

import pytest


@pytest.fixture(scope="session")
def example(tmp_path_factory, smollm2):
    """example(name): the path of the example `name` (a quantized one has its F32 twin at
    path + '.twin.gguf'), written on first use."""
    from reflex_ipc.testing.synthetic import example_gguf

    d = tmp_path_factory.mktemp("examples")
    paths = {}

    def get(name):
        if name not in paths:
            paths[name] = example_gguf(name, d / f"{name.replace('@', '-')}.gguf", tokenizer=smollm2)
        return paths[name]
    return get


@pytest.fixture(scope="session")
def runners():
    """runners(path, device, n_ctx=256, tag=""): a Runner per (file, device, context, tag: runners of
    another tag hold no state of these), closed at the end."""
    from reflex_ipc.engine import load_runner

    made = {}

    def get(path, device="numpy", n_ctx=256, tag=""):
        key = (str(path), device, n_ctx, tag)
        if key not in made:
            r = load_runner(str(path), device=device, n_ctx=n_ctx)
            assert r.ops.name == device, f"asked for the {device} backend, got {r.ops.name}"
            made[key] = r
        return made[key]
    yield get
    for r in made.values():
        r.close()


@pytest.fixture(scope="session", autouse=True)
def _close_llamas():
    yield
    from reflex_ipc.testing import llamaref

    llamaref.close_all()
