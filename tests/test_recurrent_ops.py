"""The recurrent-layer ops (ssm_conv, delta_net, ssm_scan) of the numpy backend and of the C cpu
backend against plain sequential float64 references (reflex_ipc.testing.references): the
chunked (parallel) form of a long prefill, the one-step form of decode, several sequences in
one batch, and a prefill followed by decode steps; and the cpu backend against numpy."""

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import SCAN_CHUNK, NumpyOps
from reflex_ipc.testing.references import delta_net_reference, ssm_conv_reference, ssm_scan_reference

F32 = np.float32
DEVICES = ["numpy", "cpu"]


def make_ops(device):
    if device == "numpy":
        return NumpyOps()
    from reflex_ipc.backends.cpu_ops import CpuOps

    return CpuOps(threads=2)


def _l2(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def _gdn_inputs(rng, T, Hk=2, Hv=4, D=16):
    q = _l2(rng.standard_normal((T, Hk, D))).astype(F32)
    k = _l2(rng.standard_normal((T, Hk, D))).astype(F32)
    v = rng.standard_normal((T, Hv, D)).astype(F32)
    g = -np.abs(rng.standard_normal((T, Hv)) * 0.3).astype(F32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((T, Hv))))).astype(F32)
    return q, k, v, g, beta


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 5, 37, SCAN_CHUNK, 2 * SCAN_CHUNK + 17])
def test_delta_net_matches_sequential_reference(T, device):
    rng = np.random.default_rng(T)
    q, k, v, g, beta = _gdn_inputs(rng, T)
    S0 = (0.3 * rng.standard_normal((1, 4, 16, 16))).astype(F32)
    ops = make_ops(device)
    state = S0.copy()
    out = ops.delta_net(q, k, v, g, beta, state, scale=0.25)
    ref, S = delta_net_reference(q, k, v, g, beta, S0[0], 0.25)
    np.testing.assert_allclose(out, ref, atol=2e-5 * max(1.0, np.abs(ref).max()))
    np.testing.assert_allclose(state[0], S, atol=2e-5 * max(1.0, np.abs(S).max()))


@pytest.mark.parametrize("device", DEVICES)
def test_delta_net_prefill_then_steps_and_sequences(device):
    """A chunked prefill then one-step decode equals the sequential reference; tokens of two
    sequences interleaved in one batch each see only their own state."""
    rng = np.random.default_rng(7)
    T = 90
    q, k, v, g, beta = _gdn_inputs(rng, T)
    ops = make_ops(device)
    state = np.zeros((3, 4, 16, 16), F32)
    outs = [ops.delta_net(q[:80], k[:80], v[:80], g[:80], beta[:80], state, scale=0.25)]
    for t in range(80, T):
        outs.append(ops.delta_net(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], state, scale=0.25))
    ref, S = delta_net_reference(q, k, v, g, beta, np.zeros((4, 16, 16)), 0.25)
    np.testing.assert_allclose(np.concatenate(outs), ref, atol=2e-5 * np.abs(ref).max())
    # two sequences forked from the state: interleaved tokens, sequence ids 1 and 2
    state[1] = state[2] = state[0]
    base = state[0].copy()
    seqs = np.array([1, 2, 2, 1, 2, 1, 1])
    q2, k2, v2, g2, b2 = _gdn_inputs(rng, len(seqs))
    out = ops.delta_net(q2, k2, v2, g2, b2, state, seqs=seqs, scale=0.25)
    for s in (1, 2):
        sel = seqs == s
        r, Sr = delta_net_reference(q2[sel], k2[sel], v2[sel], g2[sel], b2[sel], base, 0.25)
        np.testing.assert_allclose(out[sel], r, atol=2e-5 * np.abs(r).max())
        np.testing.assert_allclose(state[s], Sr, atol=2e-5 * np.abs(Sr).max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 3, 37, 40])
def test_ssm_conv_matches_reference_and_keeps_state(T, device):
    rng = np.random.default_rng(T)
    C, K = 12, 4
    x = rng.standard_normal((T, C)).astype(F32)
    w = rng.standard_normal((C, K)).astype(F32)
    s0 = rng.standard_normal((2, K - 1, C)).astype(F32)
    ops = make_ops(device)
    state = s0.copy()
    y = ops.ssm_conv(x, state, w, seqs=[1] * T)
    ref, sref = ssm_conv_reference(x, s0[1], w)
    np.testing.assert_allclose(y, ref, atol=1e-5)
    np.testing.assert_allclose(state[1], sref, atol=0)
    np.testing.assert_array_equal(state[0], s0[0])  # another sequence is untouched
    # split in two calls: the state carries over
    state = s0.copy()
    y1 = ops.ssm_conv(x[:T // 2], state, w)
    y2 = ops.ssm_conv(x[T // 2:], state, w)
    ref0, _ = ssm_conv_reference(x, s0[0], w)
    np.testing.assert_allclose(np.concatenate([y1, y2]), ref0, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", [1, 9, 37, SCAN_CHUNK + 30])
def test_ssm_scan_matches_sequential_reference(T, device):
    rng = np.random.default_rng(100 + T)
    H, P, G, Ns = 4, 8, 2, 16
    x = rng.standard_normal((T, H, P)).astype(F32)
    dt = np.log1p(np.exp(rng.standard_normal((T, H)))).astype(F32)
    A = -np.exp(rng.standard_normal(H)).astype(F32)
    B = rng.standard_normal((T, G, Ns)).astype(F32)
    C = rng.standard_normal((T, G, Ns)).astype(F32)
    D = rng.standard_normal(H).astype(F32)
    S0 = (0.3 * rng.standard_normal((1, H, P, Ns))).astype(F32)
    state = S0.copy()
    y = make_ops(device).ssm_scan(x, dt, A, B, C, state, D=D)
    ref, S = ssm_scan_reference(x, dt, A, B, C, S0[0], D)
    np.testing.assert_allclose(y, ref, atol=2e-5 * np.abs(ref).max())
    np.testing.assert_allclose(state[0], S, atol=2e-5 * np.abs(S).max())


@pytest.mark.parametrize("device", DEVICES)
def test_softplus_sigmoid_columns(device):
    ops = make_ops(device)
    a = np.array([-30, -1, 0, 1, 19.9, 25], F32)
    np.testing.assert_allclose(ops.softplus(a), np.where(a > 20, a, np.log1p(np.exp(a.astype(np.float64)))),
                               rtol=1e-6)
    np.testing.assert_allclose(ops.sigmoid(a), 1 / (1 + np.exp(-a.astype(np.float64))), rtol=1e-6)
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    c = ops.columns(x, 1, 2)
    assert c.flags.c_contiguous and c.shape == (2, 3, 2)
    np.testing.assert_array_equal(c, x[..., 1:3])


@pytest.mark.parametrize("T", [1, 37])
def test_cpu_recurrent_ops_equal_numpy_over_calls_and_sequences(T):
    """The cpu backend's kernels against the numpy oracle: three calls of T tokens spread over
    three sequences (interleaved, one of them absent from the middle call), the state carried
    from call to call, within float32 rounding (the cpu runs the recurrence step by step)."""
    from reflex_ipc.backends.cpu_ops import CpuOps

    rng = np.random.default_rng(T)
    cpu, ref = CpuOps(threads=2), NumpyOps()
    H, Hk, D, P, G, Ns, C, K = 4, 2, 16, 8, 2, 5, 20, 4
    st = {"conv": 0.5 * rng.standard_normal((3, K - 1, C)), "gdn": 0.1 * rng.standard_normal((3, H, D, D)),
          "scan": 0.3 * rng.standard_normal((3, H, P, Ns))}
    mine = {k: v.astype(F32) for k, v in st.items()}
    theirs = {k: v.copy() for k, v in mine.items()}
    w = rng.standard_normal((C, K)).astype(F32)
    A, Dh = -np.exp(rng.standard_normal(H)).astype(F32), rng.standard_normal(H).astype(F32)
    for call in range(3):
        seqs = rng.integers(0, 3, T).astype(np.int32) if call != 1 else rng.integers(0, 2, T).astype(np.int32)
        x = rng.standard_normal((T, C)).astype(F32)
        q, k, v, g, beta = _gdn_inputs(rng, T, Hk, H, D)
        xs = rng.standard_normal((T, H, P)).astype(F32)
        dt = np.log1p(np.exp(rng.standard_normal((T, H)))).astype(F32)
        B, Cm = rng.standard_normal((T, G, Ns)).astype(F32), rng.standard_normal((T, G, Ns)).astype(F32)
        for ops, s in ((cpu, mine), (ref, theirs)):
            s["y"] = (ops.ssm_conv(x, s["conv"], w, seqs), ops.delta_net(q, k, v, g, beta, s["gdn"], seqs, 0.25),
                      ops.ssm_scan(xs, dt, A, B, Cm, s["scan"], seqs, D=Dh))
        for a, b in zip(mine["y"], theirs["y"]):
            assert a.shape == b.shape and a.dtype == F32
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, np.abs(b).max()))
        for name in ("conv", "gdn", "scan"):
            np.testing.assert_allclose(mine[name], theirs[name], rtol=0,
                                       atol=1e-5 * max(1.0, np.abs(theirs[name]).max()))


def test_cpu_capture_of_a_recurrent_step_updates_the_state_once_per_launch():
    """CpuOps.capture runs the step to record it, then puts the recurrent state back, so that
    (as on CUDA, where capturing runs nothing) each launch advances the state by one step."""
    from reflex_ipc.backends.cpu_ops import CpuOps

    rng = np.random.default_rng(3)
    cpu, ref = CpuOps(threads=1), NumpyOps()
    q, k, v, g, beta = _gdn_inputs(rng, 1)
    state = (0.1 * rng.standard_normal((1, 4, 16, 16))).astype(F32)
    expect = state.copy()
    graph, out = cpu.capture(lambda: cpu.delta_net(q, k, v, g, beta, state, scale=0.25))
    np.testing.assert_array_equal(state, expect)  # the capture left no trace
    for _ in range(2):
        graph.launch()
        want = ref.delta_net(q, k, v, g, beta, expect, scale=0.25)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(state, expect, rtol=0, atol=1e-6)
    assert type(graph).__name__ == "Graph"  # recorded, not an eager fallback


def test_recurrent_checks_pass_on_cpu():
    """opchecks.check_recurrent (the GPU host's checks of these ops) on the C cpu backend."""
    from reflex_ipc.backends.cpu_ops import CpuOps
    from reflex_ipc.testing import opchecks

    rows = opchecks.check_recurrent(CpuOps(threads=2), np.random.default_rng(5))
    assert rows and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
