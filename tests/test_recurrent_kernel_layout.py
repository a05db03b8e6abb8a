"""The indexing of the CUDA recurrent kernels (kernels/recurrent.cuh), emulated in numpy here where
no GPU runs: the sequence-group table CudaOps uploads (base.seq_group_table), a warp per state row
reading its token through the table, and the conv's in-place state update, against the numpy
backend on several interleaved sequences with odd sizes and state carried across calls. The
kernels themselves are checked on the GPU by reflex_ipc.testing.opchecks.check_recurrent."""

import numpy as np

from reflex_ipc.backends.base import seq_group_table
from reflex_ipc.backends.numpy_ops import NumpyOps

F32 = np.float32


def _groups(sg, n_groups, N):
    """(start, count, seq, order) per blockIdx.y, as seq_group() in recurrent.cuh reads them."""
    if sg is None:
        yield 0, N, 0, None
        return
    order = sg[2 * n_groups + 1:]
    for g in range(n_groups):
        yield int(sg[g]), int(sg[g + 1] - sg[g]), int(sg[n_groups + 1 + g]), order


def _tok(order, start, t):
    return t if order is None else int(order[start + t])


def emu_ssm_conv(x, state, w, sg, n_groups):
    """ssm_conv_f32 then ssm_conv_state_f32 (threads over channels vectorized)."""
    N, C = x.shape
    K = w.shape[1]
    y = np.full((N, C), np.nan, F32)
    flat = state.reshape(-1)  # the kernel's pointer arithmetic on the flat state
    xf = x.reshape(-1)
    c = np.arange(C)
    for start, T, seq, order in _groups(sg, n_groups, N):
        base = seq * (K - 1) * C

        def xx(j):
            return flat[base + j * C + c] if j < K - 1 else xf[_tok(order, start, j - (K - 1)) * C + c]
        for t in range(T):
            acc = np.zeros(C, F32)
            for k in range(K):
                acc += w[c, k] * xx(t + k)
            y[_tok(order, start, t), c] = acc
        for j in range(K - 1):
            flat[base + j * C + c] = xx(T + j)
    return y


def emu_delta_net(q, k, v, g, beta, state, sg, n_groups, scale):
    """delta_net_f32: a warp per row (the rows of one head vectorized), float64 here."""
    N, Hk, D = q.shape
    Hv = v.shape[1]
    out = np.full((N, Hv, D), np.nan, F32)
    flat = state.reshape(-1)
    qf, kf, vf, gf, bf, of = (a.reshape(-1) for a in (q, k, v, g, beta, out))
    i = np.arange(D)
    for start, T, seq, order in _groups(sg, n_groups, N):
        for h in range(Hv):
            hk = h % Hk
            off = ((seq * Hv + h) * D + i) * D  # row i's first column
            s = flat[off[:, None] + i[None, :]].astype(np.float64)
            for t in range(T):
                n = _tok(order, start, t)
                s *= np.exp(gf[n * Hv + h])
                kk = kf[(n * Hk + hk) * D + i]
                d = (vf[(n * Hv + h) * D + i] - s @ kk) * bf[n * Hv + h]
                s += d[:, None] * kk[None, :]
                of[(n * Hv + h) * D + i] = scale * (s @ qf[(n * Hk + hk) * D + i])
            flat[off[:, None] + i[None, :]] = s
    return out


def emu_ssm_scan(x, dt, A, B, C, D, state, sg, n_groups):
    """ssm_scan_f32: a warp per row (the rows of one head vectorized), float64 here."""
    N, H, P = x.shape
    G, Ns = B.shape[1:]
    y = np.full((N, H, P), np.nan, F32)
    flat = state.reshape(-1)
    xf, dtf, Bf, Cf, yf = (a.reshape(-1) for a in (x, dt, B, C, y))
    p, col = np.arange(P), np.arange(Ns)
    for start, T, seq, order in _groups(sg, n_groups, N):
        for h in range(H):
            gi = h // (H // G)
            off = ((seq * H + h) * P + p) * Ns
            s = flat[off[:, None] + col[None, :]].astype(np.float64)
            for t in range(T):
                n = _tok(order, start, t)
                dtv = dtf[n * H + h]
                xv = xf[(n * H + h) * P + p]
                Bp = Bf[(n * G + gi) * Ns + col]
                Cp = Cf[(n * G + gi) * Ns + col]
                s = s * np.exp(dtv * A[h]) + (xv * dtv)[:, None] * Bp[None, :]
                yf[(n * H + h) * P + p] = s @ Cp + (D[h] * xv if D is not None else 0.0)
            flat[off[:, None] + col[None, :]] = s
    return y


def _table(seqs, N):
    return (None, 1) if seqs is None else seq_group_table(np.asarray(seqs), N)


def test_seq_group_table_layout():
    sg, G = seq_group_table(np.array([2, 1, 1, 2, 3]), 5)
    assert G == 3
    np.testing.assert_array_equal(sg, [0, 2, 4, 5, 2, 1, 3, 0, 3, 1, 2, 4])
    assert sg.dtype == np.int32


def test_emulated_kernels_equal_numpy_on_interleaved_sequences():
    rng = np.random.default_rng(3)
    ops = NumpyOps()
    for seqs in (None, [1, 2, 2, 1, 3, 1, 3]):
        N = 7 if seqs is not None else 5
        # conv: odd channels and kernel width
        C, K = 13, 5
        x = rng.standard_normal((N, C)).astype(F32)
        w = rng.standard_normal((C, K)).astype(F32)
        st0 = rng.standard_normal((4, K - 1, C)).astype(F32)
        a, b = st0.copy(), st0.copy()
        for _ in range(2):  # state carried into a second call
            ref = ops.ssm_conv(x, a, w, seqs)
            got = emu_ssm_conv(x, b, w, *_table(seqs, N))
            np.testing.assert_allclose(got, ref, atol=1e-5)
            np.testing.assert_allclose(b, a, atol=0)
        # delta net: D not a multiple of 32, Hv = 3 Hk
        Hk, Hv, D = 1, 3, 37
        q = rng.standard_normal((N, Hk, D)).astype(F32) * 0.2
        k = rng.standard_normal((N, Hk, D)).astype(F32) * 0.2
        v = rng.standard_normal((N, Hv, D)).astype(F32)
        g = -np.abs(rng.standard_normal((N, Hv))).astype(F32) * 0.3
        beta = rng.uniform(0, 1, (N, Hv)).astype(F32)
        S0 = rng.standard_normal((4, Hv, D, D)).astype(F32) * 0.1
        a, b = S0.copy(), S0.copy()
        for _ in range(2):
            ref = ops.delta_net(q, k, v, g, beta, a, seqs, scale=0.3)
            got = emu_delta_net(q, k, v, g, beta, b, *_table(seqs, N), 0.3)
            np.testing.assert_allclose(got, ref, atol=1e-4)
            np.testing.assert_allclose(b, a, atol=1e-4)
        # scan: grouped B/C, D skip
        H, P, G, Ns = 6, 5, 2, 19
        xs = rng.standard_normal((N, H, P)).astype(F32)
        dt = rng.uniform(0.01, 1, (N, H)).astype(F32)
        A = -rng.uniform(0.5, 2, H).astype(F32)
        Bm = rng.standard_normal((N, G, Ns)).astype(F32)
        Cm = rng.standard_normal((N, G, Ns)).astype(F32)
        Dk = rng.standard_normal(H).astype(F32)
        S0 = rng.standard_normal((4, H, P, Ns)).astype(F32) * 0.1
        a, b = S0.copy(), S0.copy()
        for _ in range(2):
            ref = ops.ssm_scan(xs, dt, A, Bm, Cm, a, seqs, D=Dk)
            got = emu_ssm_scan(xs, dt, A, Bm, Cm, Dk, b, *_table(seqs, N))
            np.testing.assert_allclose(got, ref, atol=1e-4)
            np.testing.assert_allclose(b, a, atol=1e-4)


class EmulatedOps(NumpyOps):
    """NumpyOps whose recurrent ops run the kernel emulations above (through the group table)."""

    def ssm_conv(self, x, state, w, seqs=None):
        return emu_ssm_conv(x, state, w, *_table(seqs, x.shape[0]))

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        return emu_delta_net(q, k, v, g, beta, state, *_table(seqs, q.shape[0]), scale)

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        return emu_ssm_scan(x, dt, A, B, C, D, state, *_table(seqs, x.shape[0]))


def test_gpu_kernel_checks_pass_on_the_emulated_kernels():
    """opchecks.check_recurrent (what gpu-check runs on CUDA) passes on the emulated kernels: its
    cases (odd and realistic sizes, interleaved sequences, state carried over) are consistent."""
    from reflex_ipc.testing.opchecks import check_recurrent

    rows = check_recurrent(EmulatedOps(), np.random.default_rng(0))
    assert len(rows) > 40
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
