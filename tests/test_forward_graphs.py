"""The padding that lets captured forward graphs serve batches of other lengths
(runtime/graphs.ForwardGraphs), checked where it can fail without a GPU: the padded
batch it builds, run through the numpy backend, must give the unpadded batch's rows.
(The capture and replay themselves are checked on a GPU: scripts/gpu/gpu_check_engine.py.)"""

import numpy as np
import pytest

from reflex_ipc.engine import load_runner
from reflex_ipc.runtime.batch import Batch
from reflex_ipc.runtime.graphs import ForwardGraphs

pytestmark = pytest.mark.usefixtures("smollm2")  # the tiny models borrow its tokenizer


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def runner(request, tiny_models):
    r = load_runner(tiny_models[request.param][0], device="numpy", n_ctx=128)
    r.exec.reserve(128)
    r.state = r.exec.state
    yield r
    r.close()


def _graphs(runner):
    return ForwardGraphs(None, runner.model, runner.state)


def _system1_batch(rng, P, lens):
    """The engine's one-pass system1 layout for a prompt of P tokens and candidates of lens."""
    owner = np.concatenate([np.full(n, c) for c, n in enumerate(lens)])
    within = np.concatenate([np.arange(n) for n in lens])
    M, N = len(owner), P + len(owner)
    pos = np.concatenate([np.arange(P), P + within])
    allowed = np.zeros((N, N), dtype=bool)
    allowed[:P, :P] = np.tri(P, dtype=bool)
    allowed[P:, :P] = True
    allowed[P:, P:] = (owner[:, None] == owner[None, :]) & (within[None, :] <= within[:, None])
    ids = rng.integers(0, 200, N)
    return ids, pos, np.arange(N), allowed, slice(P - 1, N), M


@pytest.mark.parametrize("P,lens", [(5, [1, 3, 2]), (9, [2]), (20, [4, 4, 4, 3]), (1, [1])])
def test_padded_masked_batch_keeps_the_rows(runner, P, lens):
    rng = np.random.default_rng(P)
    ids, pos, slots, allowed, rows, M = _system1_batch(rng, P, lens)
    ref = runner.model.forward(runner.state, Batch(runner.ops, ids, pos, slots=slots, allowed=allowed,
                                                   key_pos=pos), rows=rows)
    fg = _graphs(runner)
    key, nb = fg._plan(len(ids), pos.astype(np.int32), slots.astype(np.int32), True, rows, "logits")
    assert nb >= len(ids) and nb in ForwardGraphs.BUCKETS and key[1] == M + 1
    ids_p, pos_p, slots_p, masks = fg._padded(nb, ids.astype(np.int32), pos.astype(np.int32),
                                               slots.astype(np.int32), allowed, pos, (0,))
    S = runner.state.n_slots
    assert masks[0].shape == (nb, S)  # the masks cover every slot of the state
    # the padded batch through the numpy backend, its mask given as visibility
    key_pos = np.zeros(S, np.int64)
    key_pos[:len(pos)] = pos
    b = Batch(runner.ops, ids_p, pos_p, slots=slots_p, allowed=np.isfinite(masks[0]), key_pos=key_pos)
    b.n_kv = S
    got = runner.model.forward(runner.state, b, rows=slice(nb - key[1], nb))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # a sliding window's mask: the window on the real rows, each padding row sees only itself
    w = 3
    _, _, _, masks = fg._padded(nb, ids.astype(np.int32), pos.astype(np.int32), slots.astype(np.int32),
                                allowed, pos, (0, w))
    pad, N = nb - len(ids), len(ids)
    expect = np.zeros((nb, S), dtype=bool)
    expect[pad:, :N] = allowed & ((pos[:, None] - pos[None, :]) < w)
    expect[np.arange(pad), N + np.arange(pad)] = True
    assert np.array_equal(np.isfinite(masks[w]), expect) and np.array_equal(np.isfinite(masks[0])[pad:, :N], allowed)


@pytest.mark.parametrize("n,start", [(5, 0), (13, 0), (3, 40)])
def test_padded_causal_batch_keeps_the_last_row(runner, n, start):
    rng = np.random.default_rng(n)
    if start:  # earlier tokens already in the cache
        runner.model.forward(runner.state, Batch(runner.ops, rng.integers(0, 200, start), range(start)))
    ids = rng.integers(0, 200, n)
    pos = np.arange(start, start + n)
    ref = runner.model.forward(runner.state, Batch(runner.ops, ids, pos), rows=slice(n - 1, n))
    fg = _graphs(runner)
    key, nb = fg._plan(n, pos.astype(np.int32), None, False, slice(n - 1, n), "logits")
    ids_p, pos_p, slots_p, masks = fg._padded(nb, ids.astype(np.int32), pos.astype(np.int32), None, None,
                                               None, ())
    assert masks == {} and slots_p is pos_p and pos_p[:nb - n].min() > pos.max()  # padding stored after
    got = runner.model.forward(runner.state, Batch(runner.ops, ids_p, pos_p), rows=slice(nb - 1, nb))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_plan_declines_what_it_cannot_pad(runner):
    fg = _graphs(runner)
    pos = np.arange(70, dtype=np.int32)
    assert fg._plan(70, pos, None, False, slice(69, 70), "logits") is None  # more than 64 tokens
    assert fg._plan(5, pos[:5], None, False, slice(0, 3), "logits") is None  # rows not ending at the last
    assert fg._plan(5, pos[:5], None, False, None, "logits") is None
    assert fg._plan(5, pos[:5] + 124, pos[:5] + 124, True, slice(4, 5), "logits") is None  # padding past the state
    assert fg._plan(5, pos[:5] + 100, pos[:5] + 100, True, slice(4, 5), "logits") is not None  # slots anywhere
    assert fg._plan(5, pos[:5] + 123, None, False, slice(4, 5), "logits") is None  # padding past the cache
    k1, b1 = fg._plan(5, pos[:5], None, False, slice(4, 5), "logits")
    k2, b2 = fg._plan(7, pos[:7], None, False, slice(6, 7), "logits")
    assert k1 == k2 and b1 == b2 == 8  # two prompt lengths, one graph
    assert fg._plan(9, pos[:9], None, False, slice(8, 9), "logits")[1] == 16


def test_cpu_graphs_are_not_padded(runner):
    """On a backend whose capture is the recorded run (the CPU) a shape is the batch's own
    length: padding would move the real rows into the x86 kernels' tiles, which sum in
    another order than a short batch's dots, so a repeated request could answer otherwise."""
    from types import SimpleNamespace

    pos = np.arange(3, dtype=np.int32)
    for ops, want in ((None, 8), (SimpleNamespace(capture_runs=True), 3)):
        fg = ForwardGraphs(ops, runner.model, runner.state)
        key, nb = fg._plan(3, pos, None, False, slice(2, 3), "logits")
        assert nb == key[0] == want
