"""The fused ops (matmul_n, matmul_glu, rms_norm_rope, the residual matmul) on the numpy
backend: exactly the unfused op sequences they stand for, and right against float64
references, on weights loaded from GGUF blocks of several formats. The CUDA kernels
behind them are checked on a GPU host (reflex_ipc/testing/opchecks.py, run by
scripts/gpu/gpu-check) and their launches in tests/test_kernels_build.py; every
architecture's layer blocks drive base.FUSED_OPS like the plain ops in tests/arch/test_matrix.py
(testing.fused_numpy.FusedNumpy)."""

import math

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.ggml_types import TYPES
from reflex_ipc.models.blocks import linear, residual
from reflex_ipc.testing import opchecks
from reflex_ipc.testing.opchecks import random_weight, weights_gguf
from reflex_ipc.testing.references import rms_norm_rope_ref

rng = np.random.default_rng(77)
FORMATS = ["F32", "F16", "Q8_0", "Q4_K"]
K = 256
SHAPES = {"q": (96, K), "k": (32, K), "v": (40, K), "gate": (72, K), "up": (72, K), "o": (K, 2 * K)}  # widths: multiples of 256 (Q4_K blocks)


@pytest.fixture(scope="module")
def ops():
    return NumpyOps()


@pytest.fixture(scope="module")
def weights(ops):
    """{(format, name): (weight as loaded, float64 reference)} for every format and shape."""
    tensors, refs = {}, {}
    for fmt in FORMATS:
        for name, (rows, cols) in SHAPES.items():
            raw, ref = random_weight(fmt, rows, cols, rng)
            tensors[f"{fmt}.{name}"] = (raw, TYPES[fmt][0], (rows, cols))
            refs[(fmt, name)] = ref
    f = weights_gguf(tensors)
    return {key: (ops.load_weight(f, f"{key[0]}.{key[1]}"), ref) for key, ref in refs.items()}


def x32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def silu64(a):
    return a / (1 + np.exp(-a))


def gelu64(a):
    return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))


@pytest.mark.parametrize("N", [1, 3, 8, 13])
@pytest.mark.parametrize("formats", [("F32",) * 3, ("F16",) * 3, ("Q8_0",) * 3, ("Q4_K",) * 3,
                                     ("Q4_K", "Q4_K", "Q8_0"), ("F16", "Q8_0")])
def test_matmul_n_is_the_separate_matmuls(ops, weights, N, formats):
    ws = [weights[(fmt, name)] for fmt, name in zip(formats, ("q", "k", "v"))]
    x = x32(N, K)
    got = ops.matmul_n(x, [w for w, _ in ws])
    assert len(got) == len(ws)
    for y, (w, ref) in zip(got, ws):
        assert y.shape == (N, w.shape[0]) and y.dtype == np.float32 and y.flags.c_contiguous
        np.testing.assert_array_equal(y, ops.matmul(x, w))
        want = x.astype(np.float64) @ ref.T
        assert np.linalg.norm(y - want) <= 1e-5 * np.linalg.norm(want)


def test_matmul_n_leading_axes_and_errors(ops, weights):
    wq, wk = weights[("Q8_0", "q")][0], weights[("Q8_0", "k")][0]
    x = x32(2, 3, K)
    q, k = ops.matmul_n(x, [wq, wk])
    assert q.shape == (2, 3, 96) and k.shape == (2, 3, 32)
    np.testing.assert_array_equal(k, ops.matmul(x, wk))
    (only,) = ops.matmul_n(x, [wk])
    np.testing.assert_array_equal(only, ops.matmul(x, wk))
    with pytest.raises(ValueError):
        ops.matmul_n(x, [])
    with pytest.raises(ValueError):
        ops.matmul_n(x, [wq, wk, wq, wk])
    with pytest.raises(ValueError):  # widths differ
        ops.matmul_n(x, [wq, weights[("Q8_0", "o")][0]])


@pytest.mark.parametrize("N", [1, 3, 8, 13])
@pytest.mark.parametrize("fmt", FORMATS + ["Q8_0/Q4_K"])
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_matmul_glu_is_matmuls_then_glu(ops, weights, N, fmt, act):
    gfmt, ufmt = fmt.split("/") if "/" in fmt else (fmt, fmt)
    (wg, rg), (wu, ru) = weights[(gfmt, "gate")], weights[(ufmt, "up")]
    x = x32(N, K)
    x *= np.float32(2 / np.std(x @ rg.T))  # gate values of a few units: the curved part of act
    got = ops.matmul_glu(x, wg, wu, act=act)
    glu = ops.swiglu if act == "silu" else ops.geglu
    np.testing.assert_array_equal(got, glu(ops.matmul(x, wg), ops.matmul(x, wu)))
    x64 = x.astype(np.float64)
    want = (silu64 if act == "silu" else gelu64)(x64 @ rg.T) * (x64 @ ru.T)
    assert got.shape == (N, 72)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)


def test_matmul_glu_errors(ops, weights):
    wg, wu = weights[("F16", "gate")][0], weights[("F16", "up")][0]
    x = x32(2, K)
    with pytest.raises(ValueError):
        ops.matmul_glu(x, wg, wu, act="relu")
    with pytest.raises(ValueError):
        ops.matmul_glu(x, wg, weights[("F16", "q")][0])


CASES = [  # (hd, n_rot, freq factors, mscale, weight)
    (16, 16, False, 1.0, True),
    (16, 8, False, 1.0, True),  # partial rotary: dims 8.. only normalized
    (32, 32, True, 1.0, True),
    (64, 48, True, 1.3, True),
    (16, 16, False, 1.0, False),  # no weight
]


@pytest.mark.parametrize("N", [1, 3, 8, 13])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_rms_norm_rope_is_norm_then_rope_in_place(ops, N, neox, case):
    hd, n_rot, ff, mscale, has_w = case
    H = 3
    x = (rng.standard_normal((N, H, hd)) * 2).astype(np.float32)
    w = rng.uniform(0.5, 1.5, hd).astype(np.float32) if has_w else None
    factors = rng.uniform(1, 4, n_rot // 2).astype(np.float32) if ff else None
    pos = ops.positions(rng.integers(0, 5000, N))
    kw = dict(n_rot=n_rot, base=1e6 if ff else 10000.0, freq_scale=0.25 if ff else 1.0,
              freq_factors=factors, neox=neox, mscale=mscale)
    # the unfused sequence (on a copy)
    want = x.copy()
    ops.rope(ops.rms_norm(want, w, 1e-6), pos, inplace=True, **kw)
    unfused = ops.rope(ops.rms_norm(x, w, 1e-6), pos, **kw)
    x0 = x.copy()
    got = ops.rms_norm_rope(x, w, 1e-6, pos, **kw)
    assert got is x  # in place
    np.testing.assert_array_equal(x, unfused)
    ref = rms_norm_rope_ref(x0, w, 1e-6, pos, n_rot, kw["base"], kw["freq_scale"], factors, neox, mscale)
    np.testing.assert_allclose(x, ref, rtol=1e-4, atol=1e-4)


def test_rms_norm_rope_on_a_matmul_output_view(ops, weights):
    """As the models use it: q from matmul_n reshaped to heads, rotated in place."""
    wq = weights[("Q8_0", "q")][0]
    x = x32(4, K)
    (q,) = ops.matmul_n(x, [wq])
    q = q.reshape(4, 6, 16)
    want = ops.rope(ops.rms_norm(q, None, 1e-5), ops.positions([0, 1, 2, 3]), neox=True)
    ops.rms_norm_rope(q, None, 1e-5, ops.positions([0, 1, 2, 3]), neox=True)
    np.testing.assert_array_equal(q, want)


@pytest.mark.parametrize("with_bias", [False, True])
def test_residual_matmul_is_the_separate_add(ops, weights, with_bias):
    w = weights[("Q4_K", "o")][0]
    a, x = x32(5, 2 * K), x32(5, K)
    b = x32(K) if with_bias else None
    want = ops.add(x, linear(ops, a, w, b))
    y = x.copy()
    assert residual(ops, y, a, w, b) is y
    np.testing.assert_array_equal(y, want)


def test_gpu_checks_of_the_fused_ops_pass_on_numpy(ops):
    """opchecks' checks of the fused kernels (the GPU ones), run on the numpy backend:
    the checks themselves (references, tolerances, poisoning) hold on the oracle."""
    check_rng = np.random.default_rng(5)
    for check in (opchecks.check_matmul_n, opchecks.check_matmul_glu,
                  opchecks.check_rms_norm_rope, opchecks.check_rms_norm_matmul_n,
                  opchecks.check_rms_norm_matmul_glu, opchecks.check_qk_rope_kv_store,
                  opchecks.check_residual_add):
        rows = check(ops, check_rng)
        assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]


@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize("Ms", [(201, 70, 57), (2048, 1024, 1024), (1024, 0, 0), (3, 5, 0)])
def test_mmnorm_grid_covers_every_row_once(Ms, split):
    """A model of fused.cuh's mmnorm_body indexing with the grid CudaOps.rms_norm_matmul_n
    launches: every row of every weight is computed by exactly one (block, warp), and in the
    split layout no block returns before the block-wide sums."""
    from reflex_ipc.backends.cuda_ops import MM_ROWS

    total = sum(Ms)
    grid = total if split else (total + MM_ROWS - 1) // MM_ROWS
    seen = {}
    for b in range(grid):
        for warp in range(1 if split else MM_ROWS):
            row, wi = (b if split else b * MM_ROWS + warp), 0
            if row >= Ms[0]:
                row, wi = row - Ms[0], 1
                if row >= Ms[1]:
                    row, wi = row - Ms[1], 2
                    if row >= Ms[2]:
                        assert not split, "a split block returned before its barriers"
                        continue
            seen[(wi, row)] = seen.get((wi, row), 0) + 1
    assert seen == {(wi, r): 1 for wi, M in enumerate(Ms) for r in range(M)}


def test_opchecks_event_timer_times_every_call_between_two_events():
    """opchecks._event_ms (gpu-check's bench timings): fn(0..reps-1) between two events, the
    span divided by reps (stand-in events: each record is one ms later)."""
    import types

    from reflex_ipc.testing import opchecks

    class Event:
        clock = [0.0]

        def record(self, stream):
            Event.clock[0] += 1.0
            self.t = Event.clock[0]

        def synchronize(self):
            pass

        def time_since(self, other):
            return self.t - other.t

    calls = []
    ops = types.SimpleNamespace(rt=types.SimpleNamespace(drv=types.SimpleNamespace(Event=Event), stream=None))
    assert opchecks._event_ms(ops, calls.append, 4) == 0.25
    assert calls == [0, 1, 2, 3]
