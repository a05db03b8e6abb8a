"""The chunked prefill kernels of delta_net / ssm_scan (kernels/chunked.cuh), emulated in numpy
float32 here where no GPU runs: the same two kernels (a prep block per (chunk, head, group), a
scan block per (CHUNK_ROWS state rows, head, group)), the same zero padding of a partial chunk
and of the key-column tiles, the same flat pointer arithmetic on the inputs, the workspaces
(indexed by position in the sequence-group table) and the state. Checked against the plain
sequential float64 recurrence (opchecks.recurrent_reference) through opchecks'
check_recurrent_chunked, which runs on the GPU host against the real kernels; and that check
is shown to fail on a wrong head mapping, a wrong group mapping, or a lost state."""

import numpy as np
import pytest

from reflex_ipc.backends.base import seq_group_table
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing import opchecks
from reflex_ipc.testing.references import delta_net_reference

F32 = np.float32
L, TJ, ROWS = 64, 32, 16  # CHUNK_L, CHUNK_TJ, CHUNK_ROWS in chunked.cuh


def _groups(sg, n_groups, N):
    """(start, count, seq, order) per group index, as seq_group_at() reads the table."""
    if sg is None:
        return [(0, N, 0, None)]
    order = sg[2 * n_groups + 1:]
    return [(int(sg[g]), int(sg[g + 1] - sg[g]), int(sg[n_groups + 1 + g]), order) for g in range(n_groups)]


def _tok(order, start, t):
    return t if order is None else int(order[start + t])


def _key_head(delta, h, H, Hq):
    return h % Hq if delta else h // (H // Hq)


def emu_prep(delta, q, k, v, g, beta, dt, A, sg, n_groups, N, Hq, H, Dk, Dv):
    """chunk_prep<DELTA>: (Aqk, Gc, Wv, Wk) flat, NaN where the kernel writes nothing."""
    T = max(c for _, c, _, _ in _groups(sg, n_groups, N))
    Aqk, Gc = np.full(N * H * L, np.nan, F32), np.full(N * H, np.nan, F32)
    Wv, Wk = np.full(N * H * Dv, np.nan, F32), np.full(N * H * Dk, np.nan, F32)
    qf, kf = q.reshape(-1), k.reshape(-1)
    Dkp = -(-Dk // TJ) * TJ
    for bz, (start, count, _, order) in enumerate(_groups(sg, n_groups, N)):
        for h in range(H):
            for bx in range(-(-T // L)):
                c0 = bx * L
                if c0 >= count:
                    continue
                Lc = min(L, count - c0)
                p0 = start + c0
                hq = _key_head(delta, h, H, Hq)
                t = np.arange(L)
                tok = np.array([_tok(order, start, c0 + i) if i < Lc else 0 for i in range(L)])
                if delta:
                    gv = np.where(t < Lc, g.reshape(-1)[tok * H + h], 0).astype(F32)
                    bs = np.where(t < Lc, beta.reshape(-1)[tok * H + h], 0).astype(F32)
                else:
                    gv = np.where(t < Lc, dt.reshape(-1)[tok * H + h] * A[h], 0).astype(F32)
                    bs = np.zeros(L, F32)
                Gs = np.cumsum(gv, dtype=F32)
                j = np.arange(Dkp)
                ok = (t[:, None] < Lc) & (j[None, :] < Dk)
                at = np.where(ok, (tok[:, None] * Hq + hq) * Dk + j[None, :], 0)
                qs, ks = np.where(ok, qf[at], 0).astype(F32), np.where(ok, kf[at], 0).astype(F32)
                qk, kk = qs @ ks.T, ks @ ks.T
                ti, ii = np.meshgrid(t, t, indexing="ij")
                dec = np.where(ii <= ti, np.exp(np.where(ii <= ti, Gs[ti] - Gs[ii], 0)), 0).astype(F32)
                for tt in range(Lc):
                    Aqk[((p0 + tt) * H + h) * L + np.arange(L)] = dec[tt] * qk[tt]
                    Gc[(p0 + tt) * H + h] = Gs[tt]
                if not delta:
                    continue
                As = np.where(ii < ti, bs[:, None] * dec * kk, 0).astype(F32)
                # right sides: columns c < Dv of beta v, then of beta exp(G) k
                R = np.zeros((L, Dv + Dk), F32)
                for tt in range(Lc):
                    n = tok[tt]
                    R[tt, :Dv] = bs[tt] * v.reshape(-1)[(n * H + h) * Dv + np.arange(Dv)]
                    R[tt, Dv:] = bs[tt] * (np.exp(Gs[tt]) * k.reshape(-1)[(n * Hq + hq) * Dk + np.arange(Dk)])
                W = np.zeros((L, Dv + Dk), F32)
                for tt in range(L):
                    W[tt] = R[tt] - As[tt, :tt] @ W[:tt]
                for tt in range(Lc):
                    Wv[((p0 + tt) * H + h) * Dv + np.arange(Dv)] = W[tt, :Dv]
                    Wk[((p0 + tt) * H + h) * Dk + np.arange(Dk)] = W[tt, Dv:]
    return Aqk, Gc, Wv, Wk


def emu_scan(delta, q, k, x, dt, Wv, Wk, Aqk, Gc, Dskip, state, out, sg, n_groups, N, Hq, H, Dk, Dv, scale):
    """chunk_scan<DELTA>: writes out and state (flat views) as the kernel does."""
    qf, kf, of, Sf = q.reshape(-1), k.reshape(-1), out.reshape(-1), state.reshape(-1)
    Dkp = -(-Dk // TJ) * TJ
    j = np.arange(Dkp)
    for bz, (start, count, seq, order) in enumerate(_groups(sg, n_groups, N)):
        for h in range(H):
            hq = _key_head(delta, h, H, Hq)
            for bx in range(-(-Dv // ROWS)):
                r0 = bx * ROWS
                base = ((seq * H + h) * Dv + r0) * Dk
                rows = np.arange(ROWS)
                okS = (r0 + rows[:, None] < Dv) & (j[None, :] < Dk)
                Ss = np.where(okS, Sf[np.where(okS, base + rows[:, None] * Dk + j[None, :], 0)], 0).astype(F32)
                dsk = F32(Dskip[h]) if (not delta and Dskip is not None) else F32(0)
                r = r0 + rows
                for c0 in range(0, count, L):
                    Lc = min(L, count - c0)
                    p0 = start + c0
                    t = np.arange(L)
                    tok = np.array([_tok(order, start, c0 + i) if i < Lc else 0 for i in range(L)])
                    Gt = np.where(t < Lc, Gc[np.minimum(p0 + t, N - 1) * H + h], 0).astype(F32)
                    Gl = Gc[(p0 + Lc - 1) * H + h]
                    eG = np.where(t < Lc, np.exp(Gt), 0).astype(F32)
                    wL = np.where(t < Lc, np.exp(Gl - Gt), 0).astype(F32)
                    ok = (t[:, None] < Lc) & (j[None, :] < Dk)
                    qt = np.where(ok, qf[np.where(ok, (tok[:, None] * Hq + hq) * Dk + j[None, :], 0)], 0).astype(F32)
                    qS = qt @ Ss.T  # [L, ROWS]
                    u = np.zeros((L, ROWS), F32)
                    okr = (t[:, None] < Lc) & (r[None, :] < Dv)
                    if delta:
                        wt = np.where(ok, Wk[np.where(ok, ((p0 + t[:, None]) * H + h) * Dk + j[None, :], 0)], 0)
                        kS = wt.astype(F32) @ Ss.T
                        wv = Wv[np.where(okr, ((p0 + t[:, None]) * H + h) * Dv + r[None, :], 0)]
                        u = np.where(okr, wv - kS, 0).astype(F32)
                    else:
                        n = tok[:, None]
                        u = np.where(okr, dt.reshape(-1)[n * H + h] *
                                     x.reshape(-1)[np.where(okr, (n * H + h) * Dv + r[None, :], 0)], 0).astype(F32)
                    i = np.arange(L)
                    okA = (t[:, None] < Lc) & (i[None, :] >= 0)
                    As = np.where(okA, Aqk[np.where(okA, ((p0 + t[:, None]) * H + h) * L + i[None, :], 0)], 0)
                    acc = eG[:, None] * qS + As.astype(F32) @ u
                    for tt in range(Lc):
                        for rr in range(ROWS):
                            if r[rr] < Dv:
                                o = (tok[tt] * H + h) * Dv + r[rr]
                                of[o] = acc[tt, rr] * F32(scale) if delta else acc[tt, rr] + dsk * x.reshape(-1)[o]
                    eL = np.exp(F32(Gl))
                    kt = np.where(ok, wL[:, None] * kf[np.where(ok, (tok[:, None] * Hq + hq) * Dk + j[None, :], 0)], 0)
                    Ss = (eL * Ss + u.T @ kt.astype(F32)).astype(F32)
                for rr in range(ROWS):
                    if r0 + rr < Dv:
                        Sf[base + rr * Dk + np.arange(Dk)] = Ss[rr, :Dk]


class EmulatedChunkedOps(NumpyOps):
    """The numpy backend with CudaOps' path choice: delta_net / ssm_scan through the emulated
    chunked kernels when `chunked` and the longest group has chunk_min tokens or more, else the
    sequential float64 recurrence (the sequential kernel's stand-in). opchecks treats it as CUDA."""
    chunked = True
    chunk_min = 32

    def _arg(self, seqs, N):
        if seqs is None:
            return None, 1, N
        table, n_groups = seq_group_table(np.asarray(seqs).reshape(-1), N)
        return table, n_groups, int(np.diff(table[:n_groups + 1]).max())

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        N, Hk, D = q.shape
        Hv = v.shape[1]
        sg, G, T = self._arg(seqs, N)
        if not (self.chunked and T >= self.chunk_min):
            out, state[...] = opchecks.recurrent_reference(
                "delta_net", {"q": q, "k": k, "v": v, "g": g, "beta": beta}, {"scale": scale}, state, seqs)
            return out.astype(F32)
        Aqk, Gc, Wv, Wk = emu_prep(True, q, k, v, g, beta, None, None, sg, G, N, Hk, Hv, D, D)
        out = np.full((N, Hv, D), np.nan, F32)
        emu_scan(True, q, k, None, None, Wv, Wk, Aqk, Gc, None, state, out, sg, G, N, Hk, Hv, D, D, scale)
        return out

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        N, H, P = x.shape
        Gq, Ns = B.shape[1], B.shape[2]
        sg, ng, T = self._arg(seqs, N)
        if not (self.chunked and T >= self.chunk_min):
            out, state[...] = opchecks.recurrent_reference(
                "ssm_scan", {"x": x, "dt": dt, "B": B, "C": C}, {"A": A, "D": D}, state, seqs)
            return out.astype(F32)
        Aqk, Gc, _, _ = emu_prep(False, C, B, None, None, None, dt, A, sg, ng, N, Gq, H, Ns, 0)
        out = np.full((N, H, P), np.nan, F32)
        emu_scan(False, C, B, x, dt, None, None, Aqk, Gc, D, state, out, sg, ng, N, Gq, H, Ns, P, 1.0)
        return out


def _failed(rows):
    return [r for r in rows if not r["ok"]]


def test_emulated_chunked_kernels_pass_the_gpu_check():
    """check_recurrent_chunked on the emulation: the chunked path (forced for every T, as on the
    GPU host) against the sequential float64 recurrence, numpy, and the sequential path."""
    rows = opchecks.check_recurrent_chunked(EmulatedChunkedOps(), np.random.default_rng(3))
    assert len(rows) > 100 and not _failed(rows), _failed(rows)[:3]
    worst = max(r["rel_err"] for r in rows)
    assert worst < opchecks.CHUNK_TOL / 10, worst  # the float32 margin the tolerance's comment claims


def test_numpy_backend_passes_the_chunked_check():
    rows = opchecks.check_recurrent_chunked(NumpyOps(), np.random.default_rng(4))
    assert rows and not _failed(rows), _failed(rows)[:3]


class _WrongHeads(NumpyOps):
    """delta_net with value head h reading key head h // (Hv / Hk) (not h % Hk)."""

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        Hk, Hv = q.shape[1], v.shape[1]
        blocked = np.arange(Hv) // (Hv // Hk)
        return NumpyOps.delta_net(self, q[:, blocked], k[:, blocked], v, g, beta, state, seqs, scale)


class _WrongGroups(NumpyOps):
    """ssm_scan with head h reading group h % G (not h // (H / G))."""

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        H, G = x.shape[1], B.shape[1]
        grp = np.arange(H) % G
        return NumpyOps.ssm_scan(self, x, dt, A, B[:, grp], C[:, grp], state, seqs, D)


class _LostState(NumpyOps):
    """Both ops starting from a zero state instead of the one carried in."""

    def delta_net(self, q, k, v, g, beta, state, seqs=None, scale=1.0):
        state[...] = 0
        return NumpyOps.delta_net(self, q, k, v, g, beta, state, seqs, scale)

    def ssm_scan(self, x, dt, A, B, C, state, seqs=None, D=None):
        state[...] = 0
        return NumpyOps.ssm_scan(self, x, dt, A, B, C, state, seqs, D)


@pytest.mark.parametrize("broken,op", [(_WrongHeads, "delta_net"), (_WrongGroups, "ssm_scan"),
                                       (_LostState, "delta_net"), (_LostState, "ssm_scan")])
def test_the_chunked_check_fails_on_a_wrong_index(broken, op):
    rows = opchecks.check_recurrent_chunked(broken(), np.random.default_rng(5))
    bad = [r for r in _failed(rows) if r["op"] == op]
    assert bad, f"{broken.__name__}: no failed {op} row"


def test_emulated_path_choice_and_partial_chunks_against_reference():
    """The emulation's chunk_min switch, a group shorter than another's first chunk, a chunk of
    one token at the end (65 = 64 + 1), and sequence 0 of the state left alone."""
    rng = np.random.default_rng(7)
    ops = EmulatedChunkedOps()
    Hk, Hv, D = 2, 4, 40
    lens = {1: 65, 2: 3, 3: 129}
    seqs = np.concatenate([np.full(n, s) for s, n in lens.items()])[rng.permutation(sum(lens.values()))]
    N = len(seqs)
    q, k = (rng.standard_normal((N, Hk, D)) / np.sqrt(D)).astype(F32), (rng.standard_normal((N, Hk, D)) / np.sqrt(D)).astype(F32)
    v = rng.standard_normal((N, Hv, D)).astype(F32)
    g = -rng.uniform(0, 0.5, (N, Hv)).astype(F32)
    beta = rng.uniform(0.1, 0.9, (N, Hv)).astype(F32)
    state = (rng.standard_normal((4, Hv, D, D)) * 0.3).astype(F32)
    st = state.copy()
    out = ops.delta_net(q, k, v, g, beta, st, seqs, scale=0.5)
    np.testing.assert_array_equal(st[0], state[0])
    for s in lens:
        idx = np.flatnonzero(seqs == s)
        want, want_s = delta_net_reference(q[idx], k[idx], v[idx], g[idx], beta[idx], state[s], 0.5)
        assert np.max(np.abs(out[idx] - want)) <= 1e-5 * np.max(np.abs(want))
        assert np.max(np.abs(st[s] - want_s)) <= 1e-5 * np.max(np.abs(want_s))
