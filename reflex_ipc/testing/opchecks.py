"""Per-op checks of a backend against float64 references, on random inputs.

Run on the CUDA backend by scripts/gpu/gpu-check (on a GPU host) and, for the fused ops,
on the numpy backend by tests/test_fused_ops.py. Each check returns a row
{"op", "case", "rel_err", "max_abs", "tol", "ok"}; rel_err = ||out - ref|| / ||ref||
against a float64 reference. Outputs are poisoned (NaN) before each launch where the
op writes into a caller buffer, so unwritten elements fail.
"""

import json
import os
import tempfile
import time

import numpy as np

from reflex_ipc import settings
from reflex_ipc.ggml_types import TYPES
from reflex_ipc.quants import dequantize

from .references import attention_ref, rms_norm_rope_ref

# byte offsets of the float16 scale fields in each block format
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
              "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64], "IQ1_M": [], "MXFP4": []}
MM_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# the formats of kernels/iq_all.cu (their own fatbin on CUDA): check_iq
IQ_TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
            "MXFP4"]
# Tolerance of the tensor-core matmuls (CudaOps with N >= mma_min_n): x and the dequantized
# weights are rounded to float16 (unit roundoff 2^-11 = 4.9e-4, a relative rounding error
# of rms 2^-11/sqrt(3) = 2.8e-4 on each operand), products are summed in float32. For a
# dot product of K terms with independent rounding errors the error relative to the
# output's norm is then about sqrt(2) * 2.8e-4 = 4e-4 whatever K; 2e-3 leaves 5x margin
# and still catches any indexing bug (a wrong or missing element gives errors of O(1/sqrt(K))
# or more). The per-row float32 kernels keep 2e-5.
MMA_TOL = 2e-3
MM_TOL = 2e-5
# Tolerance of the tensor-core prefill attention (CudaOps.attention with N >= flash_min_n,
# kernels/flash.cuh): K/V are f16 already (the reference rounds them the same way); the
# kernel rounds the scaled q and the softmax weights p to f16 (unit roundoff 2^-11, rms
# relative error 2.8e-4 each), sums in float32. A score's error is then ~2.8e-4 * |s| / sqrt(hd)
# and the output's, an average of f16 values with weights off by ~2.8e-4, about 4e-4 relative:
# 2e-3 (as MMA_TOL) leaves 5x margin. A wrong, missing or extra key shifts an output row by
# O(1 / visible keys) >= ~2e-3 of |V| for the <= 512 keys checked, which FLASH_MAX_TOL (on the
# largest element difference over max |ref|) catches where a norm over many rows would not.
FLASH_TOL = 2e-3
FLASH_MAX_TOL = 1e-2


CPU_ACT_TOL = 1.5e-2  # the cpu backend's int8 activation blocks: ~0.5% of a product measured


def mm_tol(ops, type_name, N):
    """The tolerance of ops' matmul of N rows on a weight of this type (see MMA_TOL)."""
    f16 = getattr(ops, "mma", False) and N >= ops.mma_min_n and type_name != "F32"
    return MMA_TOL if f16 else MM_TOL


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf"), float("inf")
    d = np.linalg.norm(out - ref)
    n = np.linalg.norm(ref)
    return float(d / n if n else d), float(np.max(np.abs(out - ref)) if out.size else 0.0)


def row(op, case, out, ref, tol):
    e, m = rel_err(out, ref)
    return {"op": op, "case": case, "rel_err": e, "max_abs": m, "tol": tol, "ok": bool(e <= tol)}


def random_weight(name, rows, cols, rng, ref=True):
    """(raw uint8 bytes of a [rows, cols] tensor in format `name`, float64 dequantized (None
    unless ref))."""
    tid, blk, bsize = TYPES[name]
    n = rows * cols
    if name == "F32":
        w = rng.standard_normal(n).astype(np.float32) * 0.05
        raw = w.view(np.uint8)
    elif name == "F16":
        w = (rng.standard_normal(n) * 0.05).astype(np.float16)
        raw = w.view(np.uint8)
    elif name == "BF16":
        w32 = (rng.standard_normal(n) * 0.05).astype(np.float32)
        raw = (w32.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        nb = n // blk
        raw = rng.integers(0, 256, size=(nb, bsize), dtype=np.uint8)
        for off in F16_FIELDS[name]:
            s = (rng.uniform(0.2, 1.0, nb) * 0.01 * rng.choice([-1, 1], nb)).astype(np.float16)
            raw[:, off:off + 2] = s.view(np.uint8).reshape(nb, 2)
        if name == "IQ1_M":  # its float16 d in the top nibbles of the 4 scale words (bytes 48..55)
            h = (rng.uniform(0.2, 1.0, nb) * 0.01 * rng.choice([-1, 1], nb)).astype("<f2").view("<u2")
            sc = np.ascontiguousarray(raw[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
            for k in range(4):
                sc[:, k] |= ((h >> (4 * k)) & 0xF).astype(np.uint16) << 12
            raw[:, 48:56] = sc.view(np.uint8)
        elif name == "MXFP4":  # E8M0, 2^(e - 128) with the doubled E2M1 values: 2^-9 .. 2^-6
            raw[:, 0] = rng.integers(119, 123, nb)
        raw = raw.reshape(-1)
    if not ref:
        return np.ascontiguousarray(raw), None
    ref = dequantize(np.ascontiguousarray(raw), tid, n).astype(np.float64).reshape(rows, cols)
    return np.ascontiguousarray(raw), ref


def weights_gguf(tensors):
    """An open GGUFFile holding tensors {name: (raw bytes, ggml type id, numpy-order shape)}
    (synthetic.tensors_gguf into a temporary file, unlinked once mapped)."""
    from reflex_ipc.gguffile import GGUFFile

    from .synthetic import tensors_gguf

    fd, path = tempfile.mkstemp(prefix="reflex-weights-", suffix=".gguf")
    os.close(fd)
    try:
        tensors_gguf(path, tensors)
        return GGUFFile(path)
    finally:
        os.unlink(path)


def _event_ms(ops, fn, reps):
    """GPU ms per call of fn(r), r = 0 .. reps-1, launched back to back on the runtime's stream
    between two CUDA events (the caller warms up and synchronizes first)."""
    e0, e1 = ops.rt.drv.Event(), ops.rt.drv.Event()
    e0.record(ops.rt.stream)
    for r in range(reps):
        fn(r)
    e1.record(ops.rt.stream)
    e1.synchronize()
    return e1.time_since(e0) / reps


def glu_ref(g, u, act):
    """act(g) * u in float64: silu, or ggml's tanh-approximated gelu."""
    if act == "silu":
        return g / (1 + np.exp(-g)) * u
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))) * u


def check_matmul(ops, rng):
    rows = []
    M, K = 203, 512
    tensors = {}
    refs = {}
    for name in MM_TYPES:
        raw, ref = random_weight(name, M, K, rng)
        tensors[name] = (raw, TYPES[name][0], (M, K))
        refs[name] = ref
    f = weights_gguf(tensors)
    for name in MM_TYPES:
        w = ops.load_weight(f, name)
        for N in (1, 3, 4, 5, 8, 13):
            x = rng.standard_normal((N, K)).astype(np.float32)
            out = ops.to_numpy(ops.matmul(ops.asarray(x), w))
            rows.append(row("matmul", f"{name} N={N}", out, x.astype(np.float64) @ refs[name].T, 2e-5))
        # accumulate into an existing output
        x = rng.standard_normal((2, K)).astype(np.float32)
        y0 = rng.standard_normal((2, M)).astype(np.float32)
        y = ops.asarray(y0.copy())  # numpy's asarray would alias y0
        ops.matmul(ops.asarray(x), w, out=y, accumulate=True)
        rows.append(row("matmul", f"{name} accumulate", ops.to_numpy(y),
                        y0 + x.astype(np.float64) @ refs[name].T, 2e-5))
        ids = np.array([0, 5, M - 1, 17, 5], dtype=np.int32)
        out = ops.to_numpy(ops.embed(w, ids, scale=0.5))
        rows.append(row("get_rows", name, out, refs[name][ids] * 0.5, 1e-6))
    return rows


def check_matmul_prefill(ops, rng):
    """Matmuls of many rows (prefill; on CUDA the tensor-core kernels, here from 8 rows on
    whatever ops.mma_min_n is, so partial token tiles are checked too): output rows that are
    no multiple of the tiles (1000, and 4097 like an odd vocabulary), token counts around
    the tile size, K with a partial last tile (352 = 5.5 x 64), plain and accumulate, every
    format; outputs poisoned so an unwritten element fails."""
    if hasattr(ops, "mma_min_n"):
        ops.mma_min_n = 8  # an instance attribute over the class's threshold, until the end
        try:
            return _check_matmul_prefill(ops, rng)
        finally:
            del ops.mma_min_n
    return _check_matmul_prefill(ops, rng)


def _check_matmul_prefill(ops, rng):
    rows = []
    shapes = [(name, M, 512) for name in MM_TYPES for M in (1000, 4097)]
    shapes += [(name, 1000, 352) for name in ("Q8_0", "Q4_0", "F16")]
    W = _weights(ops, {f"{name}.{M}.{K}": (name, M, K) for name, M, K in shapes}, rng)
    for name, M, K in shapes:
        w, ref = W[f"{name}.{M}.{K}"]
        for N in ((8, 16, 33, 128, 500, 512) if K == 512 else (16, 100)):
            x = rng.standard_normal((N, K)).astype(np.float32)
            poison(ops, (N, M))
            out = ops.to_numpy(ops.matmul(ops.asarray(x), w))
            rows.append(row("matmul_prefill", f"{name} M={M} K={K} N={N}", out, x.astype(np.float64) @ ref.T,
                            mm_tol(ops, name, N)))
            if N in (33, 500) and name in ("Q4_K", "Q5_K", "Q6_K"):  # REFLEX_MMA_WIDE each way: the same bits
                rows += _tile_variants(ops, lambda: ops.to_numpy(ops.matmul(ops.asarray(x), w)), out,
                                       f"{name} M={M} K={K} N={N}", "matmul_prefill", ("mma_wide",))
            if N in (33, 500) and M == 1000:
                y0 = rng.standard_normal((N, M)).astype(np.float32)
                y = ops.asarray(y0.copy())  # (the numpy backend's asarray keeps the array)
                ops.matmul(ops.asarray(x), w, out=y, accumulate=True)
                rows.append(row("matmul_prefill", f"{name} M={M} K={K} N={N} accumulate", ops.to_numpy(y),
                                y0 + x.astype(np.float64) @ ref.T, mm_tol(ops, name, N)))
    return rows


def check_elementwise(ops, rng):
    rows = []
    a = rng.standard_normal((7, 1000)).astype(np.float32)
    b = rng.standard_normal((7, 1000)).astype(np.float32)
    v = rng.standard_normal(1000).astype(np.float32)
    A, B, V = ops.asarray(a), ops.asarray(b), ops.asarray(v)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    rows.append(row("add", "same shape", ops.to_numpy(ops.add(A, B)), a64 + b64, 1e-7))
    rows.append(row("add", "row bias", ops.to_numpy(ops.add(A, V)), a64 + v, 1e-7))
    rows.append(row("mul", "same shape", ops.to_numpy(ops.mul(A, B)), a64 * b64, 1e-7))
    rows.append(row("mul", "row", ops.to_numpy(ops.mul(A, V)), a64 * v, 1e-7))
    rows.append(row("scale", "", ops.to_numpy(ops.scale(A, 0.37)), a64 * 0.37, 1e-7))
    big = (a * 40).astype(np.float32)
    rows.append(row("softcap", "c=30", ops.to_numpy(ops.softcap(ops.asarray(big), 30.0)),
                    30 * np.tanh(big.astype(np.float64) / 30), 1e-6))
    silu = a64 / (1 + np.exp(-a64))
    gelu = 0.5 * a64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (a64 + 0.044715 * a64 ** 3)))
    rows.append(row("silu", "", ops.to_numpy(ops.silu(A)), silu, 1e-6))
    rows.append(row("gelu", "tanh", ops.to_numpy(ops.gelu(A)), gelu, 1e-6))
    rows.append(row("swiglu", "", ops.to_numpy(ops.swiglu(A, B)), silu * b64, 1e-6))
    rows.append(row("geglu", "", ops.to_numpy(ops.geglu(A, B)), gelu * b64, 1e-6))
    # norms
    for dim in (64, 576, 1024, 4096):
        x = (rng.standard_normal((5, dim)) * 3).astype(np.float32)
        w = rng.standard_normal(dim).astype(np.float32)
        x64 = x.astype(np.float64)
        ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
        rows.append(row("rms_norm", f"dim={dim}", ops.to_numpy(ops.rms_norm(ops.asarray(x), ops.asarray(w), 1e-6)),
                        ref, 1e-6))
    # rope
    for neox in (False, True):
        for hd, n_rot, ff in ((64, 64, False), (128, 64, False), (128, 128, True)):
            N, H = 6, 3
            x = rng.standard_normal((N, H, hd)).astype(np.float32)
            pos = np.array([0, 1, 7, 100, 2047, 30000], dtype=np.int32)
            factors = rng.uniform(1, 8, n_rot // 2).astype(np.float32) if ff else None
            base, fs = 1e6 if ff else 10000.0, 0.5 if ff else 1.0
            out = ops.to_numpy(ops.rope(ops.asarray(x), pos, n_rot=n_rot, base=base, freq_scale=fs,
                                        freq_factors=ops.asarray(factors) if ff else None, neox=neox))
            ref = x.astype(np.float64).copy()
            i = np.arange(n_rot // 2)
            inv = base ** (-2.0 * i / n_rot) * fs
            if ff:
                inv = inv / factors
            ang = pos[:, None].astype(np.float64) * inv[None, :]
            c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
            ia, ib = (i, i + n_rot // 2) if neox else (2 * i, 2 * i + 1)
            x0, x1 = ref[..., ia].copy(), ref[..., ib].copy()
            ref[..., ia] = x0 * c - x1 * s
            ref[..., ib] = x0 * s + x1 * c
            rows.append(row("rope", f"{'neox' if neox else 'norm'} hd={hd} n_rot={n_rot} ff={ff}", out, ref, 1e-6))
    return rows


def poison(ops, *shapes):
    """Put NaN-filled blocks of these shapes on the pool's free lists, so that the next
    arrays an op allocates with them start as NaN (an element the op does not write fails)."""
    held = [ops.asarray(np.full(shape, np.nan, np.float32)) for shape in shapes]
    ops.synchronize()
    del held


def _weights(ops, specs, rng):
    """{key: (device weight, float64 reference)} for specs {key: (type name, rows, cols)}."""
    tensors, refs = {}, {}
    for key, (name, rows, cols) in specs.items():
        raw, refs[key] = random_weight(name, rows, cols, rng)
        tensors[key] = (raw, TYPES[name][0], (rows, cols))
    f = weights_gguf(tensors)
    return {key: (ops.load_weight(f, key), refs[key]) for key in specs}


def check_matmul_n(ops, rng):
    """matmul_n (mmn kernels): q/k/v-like weights of every type in one launch, output sizes
    that make blocks straddle two weights; mixed types (grouped launches, plain matmuls)."""
    rows = []
    K, Ms = 512, (201, 70, 57)
    sets = [(t, t, t) for t in MM_TYPES] + [(t, t) for t in ("Q8_0", "Q4_K")]
    sets += [("Q4_K", "Q4_K", "Q6_K"), ("Q6_K", "Q4_K", "Q6_K"), ("Q8_0", "F16", "Q4_0")]
    for types in sets:
        W = _weights(ops, {f"w{i}": (t, Ms[i], K) for i, t in enumerate(types)}, rng)
        ws = [W[f"w{i}"][0] for i in range(len(types))]
        for N in (1, 4, 5, 8, 13, 16, 70):
            x = rng.standard_normal((N, K)).astype(np.float32)
            X = ops.asarray(x)
            poison(ops, *[(N, Ms[i]) for i in range(len(types))])
            outs = ops.matmul_n(X, ws)
            for i, out in enumerate(outs):
                ref = x.astype(np.float64) @ W[f"w{i}"][1].T
                rows.append(row("matmul_n", f"{'/'.join(types)} N={N} out{i}", ops.to_numpy(out), ref,
                                mm_tol(ops, types[i], N)))
                if N in (1, 13, 70):  # within float32 rounding of the plain matmul kernel
                    rows.append(row("matmul_n", f"{'/'.join(types)} N={N} out{i} vs matmul",
                                    ops.to_numpy(out), ops.to_numpy(ops.matmul(X, ws[i])), 1e-6))
    return rows


def check_matmul_glu(ops, rng):
    """matmul_glu (mmglu kernels): silu and tanh-gelu units of every type; gate and up of
    different types (two matmuls + swiglu/geglu)."""
    rows = []
    K, M = 512, 203
    pairs = [(t, t) for t in MM_TYPES] + [("Q8_0", "Q4_K"), ("Q4_K", "Q6_K"), ("F16", "BF16")]
    for g_t, u_t in pairs:
        W = _weights(ops, {"gate": (g_t, M, K), "up": (u_t, M, K)}, rng)
        (wg, rg), (wu, ru) = W["gate"], W["up"]
        for N in (1, 4, 5, 8, 13, 16, 70):
            x = rng.standard_normal((N, K))
            x = (x * 2 / np.std(x @ rg.T)).astype(np.float32)  # gate values of a few units
            X = ops.asarray(x)
            g64, u64 = x.astype(np.float64) @ rg.T, x.astype(np.float64) @ ru.T
            for act in ("silu", "gelu"):
                poison(ops, (N, M))
                out = ops.to_numpy(ops.matmul_glu(X, wg, wu, act=act))
                ref = glu_ref(g64, u64, act)
                case = f"{g_t}/{u_t} {act} N={N}"
                # gated unit of f16-rounded products: about twice the matmul's error
                tol = MM_TOL if mm_tol(ops, g_t, N) == mm_tol(ops, u_t, N) == MM_TOL else 2 * MMA_TOL
                rows.append(row("matmul_glu", case, out, ref, tol))
                if N == 70 and g_t == u_t and g_t in ("Q4_K", "Q5_K", "Q6_K"):  # REFLEX_MMA_WIDE each way
                    rows += _tile_variants(ops, lambda: ops.to_numpy(ops.matmul_glu(X, wg, wu, act=act)), out, case,
                                           "matmul_glu", ("mma_wide",))
                if N in (1, 13, 70):
                    glu = ops.swiglu if act == "silu" else ops.geglu
                    unfused = ops.to_numpy(glu(ops.matmul(X, wg), ops.matmul(X, wu)))
                    # the fused and the plain kernels make the same sums (tensor-core ones too)
                    rows.append(row("matmul_glu", case + " vs matmuls+glu", out, unfused, 1e-6))
    return rows


def check_matmul_nt(ops, rng):
    """Matvecs of 2 <= N < 64 tokens (CUDA: matvec_nt.cuh's mmt / mmtn / mmtglu, switched on
    here whatever CudaOps.mmnt says, and compared with the warp-per-row mm4 / mm8 ones): every
    format, odd row counts, K of 2304 (threads with 3 chunks and with 2) and 256 (one warp
    busy), token counts around the 8-token groups, plain and accumulate, q/k/v of three
    heights (blocks straddling two weights), gate/up silu and gelu; outputs poisoned."""
    if not hasattr(ops, "mmnt"):
        return _check_matmul_nt(ops, rng)
    mmnt0 = ops.mmnt
    ops.mmnt = True
    try:
        return _check_matmul_nt(ops, rng)
    finally:
        ops.mmnt = mmnt0


def _vs_old(ops, fn):
    """fn() on the warp-per-row kernels (CUDA with ops.mmnt off), or None on other backends."""
    if not hasattr(ops, "mmnt"):
        return None
    ops.mmnt = False
    try:
        return fn()
    finally:
        ops.mmnt = True


def _check_matmul_nt(ops, rng):
    rows = []
    Ns = (2, 3, 7, 8, 9, 17, 63)
    for name in MM_TYPES:
        W = _weights(ops, {"a": (name, 203, 2304), "b": (name, 5, 256)}, rng)
        for key, Nk in (("a", Ns), ("b", (2, 9))):
            w, ref = W[key]
            M, K = ref.shape
            for N in Nk:
                x = rng.standard_normal((N, K)).astype(np.float32)
                X = ops.asarray(x)
                poison(ops, (N, M))
                out = ops.to_numpy(ops.matmul(X, w))
                case = f"{name} M={M} K={K} N={N}"
                rows.append(row("matmul_nt", case, out, x.astype(np.float64) @ ref.T, MM_TOL))
                if N in (3, 9):
                    y0 = rng.standard_normal((N, M)).astype(np.float32)
                    y = ops.asarray(y0.copy())
                    ops.matmul(X, w, out=y, accumulate=True)
                    rows.append(row("matmul_nt", case + " accumulate", ops.to_numpy(y),
                                    y0 + x.astype(np.float64) @ ref.T, MM_TOL))
                if N in (7, 17):
                    old = _vs_old(ops, lambda: ops.to_numpy(ops.matmul(X, w)))
                    if old is not None:
                        rows.append(row("matmul_nt", case + " vs mm4/mm8", out, old, 4e-6))
    K, Ms = 1280, (201, 70, 57)
    sets = [(t, t, t) for t in MM_TYPES] + [("Q8_0", "Q8_0"), ("Q4_K", "Q4_K", "Q6_K")]
    for types in sets:
        W = _weights(ops, {f"w{i}": (t, Ms[i], K) for i, t in enumerate(types)}, rng)
        ws = [W[f"w{i}"][0] for i in range(len(types))]
        for N in (2, 7, 9, 17, 63):
            x = rng.standard_normal((N, K)).astype(np.float32)
            X = ops.asarray(x)
            poison(ops, *[(N, Ms[i]) for i in range(len(types))])
            outs = [ops.to_numpy(o) for o in ops.matmul_n(X, ws)]
            for i, out in enumerate(outs):
                rows.append(row("matmul_n_nt", f"{'/'.join(types)} N={N} out{i}", out,
                                x.astype(np.float64) @ W[f"w{i}"][1].T, MM_TOL))
            if N == 9:
                old = _vs_old(ops, lambda: [ops.to_numpy(o) for o in ops.matmul_n(X, ws)])
                for i in range(len(old or ())):
                    rows.append(row("matmul_n_nt", f"{'/'.join(types)} N={N} out{i} vs mmn", outs[i], old[i],
                                    4e-6))
    M = 203
    for t in MM_TYPES:
        W = _weights(ops, {"gate": (t, M, K), "up": (t, M, K)}, rng)
        (wg, rg), (wu, ru) = W["gate"], W["up"]
        for N in (2, 3, 8, 9, 17, 63):
            x = rng.standard_normal((N, K))
            x = (x * 2 / np.std(x @ rg.T)).astype(np.float32)  # gate values of a few units
            X = ops.asarray(x)
            g64, u64 = x.astype(np.float64) @ rg.T, x.astype(np.float64) @ ru.T
            for act in ("silu", "gelu"):
                poison(ops, (N, M))
                out = ops.to_numpy(ops.matmul_glu(X, wg, wu, act=act))
                ref = glu_ref(g64, u64, act)
                rows.append(row("matmul_glu_nt", f"{t}/{t} {act} N={N}", out, ref, MM_TOL))
                if N == 9:
                    old = _vs_old(ops, lambda: ops.to_numpy(ops.matmul_glu(X, wg, wu, act=act)))
                    if old is not None:
                        rows.append(row("matmul_glu_nt", f"{t}/{t} {act} N={N} vs mmglu", out, old, 4e-6))
    return rows


def check_rms_norm_rope(ops, rng):
    """rms_norm_rope (rmsnorm_rope_f32): per-head RMSNorm + rope in place; normal and neox
    pairs, partial rotary, freq factors and scale, mscale, no weight; against float64 and
    against rms_norm then rope on the device."""
    rows = []
    cases = [  # hd, n_rot, H, freq factors, mscale, weight
        (128, 128, 16, False, 1.0, True), (128, 64, 8, False, 1.0, True), (64, 64, 3, True, 1.0, True),
        (256, 256, 4, False, 1.0, True), (256, 128, 2, True, 1.2, True), (80, 48, 5, True, 1.0, False),
    ]
    for hd, n_rot, H, ff, mscale, has_w in cases:
        for neox in (False, True):
            for N in (1, 5, 13):
                x = (rng.standard_normal((N, H, hd)) * 3).astype(np.float32)
                w = rng.uniform(0.5, 1.5, hd).astype(np.float32) if has_w else None
                factors = rng.uniform(1, 8, n_rot // 2).astype(np.float32) if ff else None
                pos = np.array([0, 1, 7, 100, 2047, 30000, 5, 9, 11, 13, 17, 4095, 12345][:N], np.int32)
                kw = dict(n_rot=n_rot, base=1e6 if ff else 10000.0, freq_scale=0.5 if ff else 1.0,
                          freq_factors=ops.asarray(factors) if ff else None, neox=neox, mscale=mscale)
                W = ops.asarray(w) if has_w else None
                X = ops.asarray(x.copy())  # rotated in place (numpy's asarray would not copy)
                got = ops.rms_norm_rope(X, W, 1e-6, pos, **kw)
                case = f"{'neox' if neox else 'norm'} hd={hd} n_rot={n_rot} H={H} N={N} ff={ff} m={mscale} w={has_w}"
                rows.append({"op": "rms_norm_rope", "case": case + " returns x", "ok": got is X})
                out = ops.to_numpy(X)
                ref = rms_norm_rope_ref(x, w, 1e-6, pos, n_rot, kw["base"], kw["freq_scale"], factors, neox,
                                        mscale)
                rows.append(row("rms_norm_rope", case, out, ref, 1e-6))
                unfused = ops.rope(ops.rms_norm(ops.asarray(x.copy()), W, 1e-6), pos, inplace=True, **kw)
                rows.append(row("rms_norm_rope", case + " vs rms_norm+rope", out, ops.to_numpy(unfused), 1e-6))
    return rows


def _rms64(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    return y * w if w is not None else y


def _graph_rows(ops, op, case, fn, X, x_new, refs, tol):
    """fn() captured in a graph (backends with capture), x_new written into X, the graph
    replayed: its outputs against refs (computed for x_new). No rows without capture."""
    if not hasattr(ops, "capture"):
        return []
    g, outs = ops.capture(fn)
    try:
        ops.write(X, x_new)
        g.launch()
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        return [row(op, f"{case} graph out{i}", ops.to_numpy(o), r, tol) for i, (o, r) in enumerate(zip(outs, refs))]
    finally:
        g.close()


def check_rms_norm_matmul_n(ops, rng):
    """base.rms_norm_matmul_n (CUDA: mmnorm1 kernels for one token): q/k/v-like weights of every
    type, a lone weight (the LM head), mixed types (one launch per type), widths that are not a
    multiple of 256 where the format allows, no norm weight, several tokens (the two ops);
    against float64, against rms_norm + matmul_n on the device, and replayed from a graph."""
    from reflex_ipc.backends.base import rms_norm_matmul_n

    rows = []
    Ms = (201, 70, 57)
    sets = [(t, t, t) for t in MM_TYPES] + [("Q8_0",), ("Q6_K",), ("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "F16", "Q4_0")]
    for types in sets:
        kq = any(t.endswith("_K") for t in types)
        K = 768 if kq else (288 if any(t.startswith("Q") for t in types) else 136)
        W = _weights(ops, {f"w{i}": (t, Ms[i], K) for i, t in enumerate(types)}, rng)
        ws = [W[f"w{i}"][0] for i in range(len(types))]
        for N, has_w in ((1, True), (1, False), (3, True)):
            x = (rng.standard_normal((N, K)) * 3 + 0.5).astype(np.float32)
            nw = rng.uniform(0.5, 1.5, K).astype(np.float32) if has_w else None
            X, NW = ops.asarray(x), ops.asarray(nw) if has_w else None
            poison(ops, *[(N, Ms[i]) for i in range(len(types))])
            outs = rms_norm_matmul_n(ops, X, NW, 1e-6, ws)
            h = _rms64(x, nw, 1e-6)
            plain = ops.matmul_n(ops.rms_norm(X, NW, 1e-6), ws)
            case = f"{'/'.join(types)} K={K} N={N} w={has_w}"
            for i, out in enumerate(outs):
                rows.append(row("rms_norm_matmul_n", f"{case} out{i}", ops.to_numpy(out), h @ W[f"w{i}"][1].T, 2e-5))
                rows.append(row("rms_norm_matmul_n", f"{case} out{i} vs rms_norm+matmul_n", ops.to_numpy(out),
                                ops.to_numpy(plain[i]), 5e-6))
            if N == 1 and has_w:
                # the plain one-token matvec on these widths, adding into y (CUDA: mmsk1, a block a row)
                y0 = rng.standard_normal((1, Ms[0])).astype(np.float32)
                Y = ops.asarray(y0.copy())
                ops.matmul(X, ws[0], out=Y, accumulate=True)
                rows.append(row("matmul", f"{types[0]} K={K} N=1 accumulate", ops.to_numpy(Y),
                                y0 + x.astype(np.float64) @ W["w0"][1].T, 2e-5))
                x2 = (rng.standard_normal((N, K)) * 2 - 0.3).astype(np.float32)
                h2 = _rms64(x2, nw, 1e-6)
                # the fused op and the plain one-token matvec (CUDA: mmsk1) in one graph
                rows += _graph_rows(ops, "rms_norm_matmul_n", case,
                                    lambda: rms_norm_matmul_n(ops, X, NW, 1e-6, ws) + [ops.matmul(X, ws[0])], X, x2,
                                    [h2 @ W[f"w{i}"][1].T for i in range(len(types))]
                                    + [x2.astype(np.float64) @ W["w0"][1].T], 2e-5)
    return rows


def check_rms_norm_matmul_glu(ops, rng):
    """base.rms_norm_matmul_glu (CUDA: mmgnorm1 kernels for one token): silu and tanh-gelu units
    of every type, gate and up of different types and several tokens (the plain ops); against
    float64, against rms_norm + matmul_glu on the device, and replayed from a graph."""
    from reflex_ipc.backends.base import rms_norm_matmul_glu

    rows = []
    M = 203
    pairs = [(t, t) for t in MM_TYPES] + [("Q4_K", "Q6_K")]
    for g_t, u_t in pairs:
        kq = g_t.endswith("_K") or u_t.endswith("_K")
        K = 768 if kq else (288 if g_t.startswith("Q") else 136)
        W = _weights(ops, {"gate": (g_t, M, K), "up": (u_t, M, K)}, rng)
        (wg, rg), (wu, ru) = W["gate"], W["up"]
        for N in (1, 3):
            nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
            x = (rng.standard_normal((N, K)) + 0.2).astype(np.float32)
            # gate values of a few units (the norm undoes any scale of x: scale its weight)
            nw = (nw * 2 / np.std(_rms64(x, nw, 1e-6) @ rg.T)).astype(np.float32)
            h = _rms64(x, nw, 1e-6)
            X, NW = ops.asarray(x), ops.asarray(nw)
            g64, u64 = h @ rg.T, h @ ru.T
            for act in ("silu", "gelu"):
                poison(ops, (N, M))
                out = ops.to_numpy(rms_norm_matmul_glu(ops, X, NW, 1e-6, wg, wu, act=act))
                ref = glu_ref(g64, u64, act)
                case = f"{g_t}/{u_t} {act} K={K} N={N}"
                rows.append(row("rms_norm_matmul_glu", case, out, ref, 2e-5))
                plain = ops.to_numpy(ops.matmul_glu(ops.rms_norm(X, NW, 1e-6), wg, wu, act=act))
                rows.append(row("rms_norm_matmul_glu", case + " vs rms_norm+matmul_glu", out, plain, 5e-6))
                if N == 1 and act == "silu":
                    x2 = (x * 0.7 - 0.1).astype(np.float32)
                    h2 = _rms64(x2, nw, 1e-6)
                    g2, u2 = h2 @ rg.T, h2 @ ru.T
                    rows += _graph_rows(ops, "rms_norm_matmul_glu", case,
                                        lambda: rms_norm_matmul_glu(ops, X, NW, 1e-6, wg, wu, act="silu"), X, x2,
                                        [g2 / (1 + np.exp(-g2)) * u2], 2e-5)
                    ops.write(X, x)  # the graph rows left x2 in X: the gelu case reads X next
    return rows


def check_residual_add(ops, rng):
    """base.residual_add (CUDA: residual_add_f32): x = (x + scale * rms_norm(y, w, eps)) * out_scale
    in place, with and without the norm and its weight, a residual scale and an output scale,
    one token and several, rows of 32 to 5120 values; against float64, against the plain ops on
    the device (rms_norm, scale, add, scale), and replayed from a graph."""
    from reflex_ipc.backends.base import residual_add

    rows = []
    for D, N in ((32, 1), (1024, 1), (2048, 3), (5120, 1)):
        for norm, weighted, scale, out_scale in ((True, True, 1.0, 1.0), (True, False, 1.0, 1.0),
                                                 (False, False, 0.22, 1.0), (True, True, 1.0, 0.7),
                                                 (True, True, 0.5, 1.3)):
            x = rng.standard_normal((N, D)).astype(np.float32)
            y = (3 * rng.standard_normal((N, D)) + 0.5).astype(np.float32)
            w = rng.uniform(0.5, 1.5, D).astype(np.float32) if weighted else None
            post = _rms64(y, w, 1e-6) if norm else y.astype(np.float64)
            ref = (x + scale * post) * out_scale
            X, Y = ops.asarray(x), ops.asarray(y)
            W = ops.asarray(w) if w is not None else None
            case = f"D={D} N={N} norm={norm} w={weighted} scale={scale} out_scale={out_scale}"
            out = residual_add(ops, X, Y, W, 1e-6, norm=norm, scale=scale, out_scale=out_scale)
            assert out is X, "residual_add must write x in place"
            rows.append(row("residual_add", case, ops.to_numpy(X), ref, 2e-6))
            P = ops.asarray(x)
            py = ops.rms_norm(Y, W, 1e-6) if norm else Y
            py = ops.scale(py, scale) if scale != 1.0 else py
            ops.add(P, py, out=P)
            if out_scale != 1.0:
                ops.scale(P, out_scale, out=P)
            rows.append(row("residual_add", case + " vs the plain ops", ops.to_numpy(X), ops.to_numpy(P), 1e-6))
            if N == 1 and norm and weighted and scale == 1.0 and out_scale == 1.0 and ops.name == "cuda":
                # replayed with new inputs (x written back after the capture: a backend whose
                # capture also runs the step has added into it once)
                y2 = (y * 0.6 + 0.2).astype(np.float32)
                X2 = ops.asarray(x)
                g, _ = ops.capture(lambda: residual_add(ops, X2, Y, W, 1e-6))
                try:
                    ops.write(X2, x)
                    ops.write(Y, y2)
                    g.launch()
                    rows.append(row("residual_add", case + " graph", ops.to_numpy(X2), x + _rms64(y2, w, 1e-6), 2e-6))
                finally:
                    g.close()
    return rows


def check_qk_rope_kv_store(ops, rng):
    """base.qk_rope_kv_store (CUDA: qk_rope_kv_store_f32): q and k normed (or not) and rotated
    in place, k and v stored at slots of the layer's K/V; normal and neox pairs, partial
    rotary, freq factors, mscale, no norm weight, GQA, slots apart from positions; against
    float64 (K/V at the cache's precision), against the plain ops on the device, and replayed
    from a graph."""
    from reflex_ipc.backends.base import qk_rope_kv_store

    rows = []
    kv_tol = 1e-3 if ops.kv_dtype == "float16" else 1e-6
    cases = [  # hd, n_rot, Hq, Hkv, freq factors, mscale, norm, weight
        (128, 128, 16, 8, False, 1.0, True, True), (64, 64, 6, 2, True, 1.0, True, True),
        (128, 64, 4, 4, False, 1.2, True, False), (80, 48, 5, 1, True, 1.0, False, False),
        (256, 256, 4, 2, False, 1.0, True, True),
    ]
    n_slots = 40
    for hd, n_rot, Hq, Hkv, ff, mscale, norm, has_w in cases:
        for neox in (False, True):
            for N in (1, 5):
                q = (rng.standard_normal((N, Hq, hd)) * 3).astype(np.float32)
                k = (rng.standard_normal((N, Hkv, hd)) * 3).astype(np.float32)
                v = rng.standard_normal((N, Hkv, hd)).astype(np.float32)
                qw = rng.uniform(0.5, 1.5, hd).astype(np.float32) if has_w else None
                kw_ = rng.uniform(0.5, 1.5, hd).astype(np.float32) if has_w else None
                factors = rng.uniform(1, 8, n_rot // 2).astype(np.float32) if ff else None
                pos = np.array([3, 0, 17, 30000, 9][:N], np.int32)
                slots = rng.permutation(n_slots)[:N].astype(np.int32)
                rope = dict(n_rot=n_rot, base=1e6 if ff else 10000.0, freq_scale=0.5 if ff else 1.0,
                            freq_factors=ops.asarray(factors) if ff else None, neox=neox, mscale=mscale)

                # every input on the device beforehand: a capture may not copy from the host
                QW, KW = (ops.asarray(qw), ops.asarray(kw_)) if has_w else (None, None)
                P, S = ops.positions(pos), ops.positions(slots)

                def run(qa, ka, va, kc, vc):
                    return qk_rope_kv_store(ops, qa, ka, va, QW, KW, 1e-6, P, kc, vc, S, norm=norm, **rope)

                def ref(a, w):
                    if norm:
                        return rms_norm_rope_ref(a, w, 1e-6, pos, n_rot, rope["base"], rope["freq_scale"], factors,
                                                 neox, mscale)
                    return rms_norm_rope_ref(a, None, 1e-6, pos, n_rot, rope["base"], rope["freq_scale"], factors,
                                             neox, mscale) * np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True)
                                                                     + 1e-6)

                case = (f"{'neox' if neox else 'norm'} hd={hd} n_rot={n_rot} Hq={Hq} Hkv={Hkv} N={N} ff={ff} "
                        f"m={mscale} qknorm={norm} w={has_w}")
                Q, Kx, V = ops.asarray(q.copy()), ops.asarray(k.copy()), ops.asarray(v.copy())
                kc, vc = ops.zeros((Hkv, n_slots, hd), ops.kv_dtype), ops.zeros((Hkv, n_slots, hd), ops.kv_dtype)
                gq, gk = run(Q, Kx, V, kc, vc)
                rows.append({"op": "qk_rope_kv_store", "case": case + " returns q, k", "ok": gq is Q and gk is Kx})
                rq, rk = ref(q, qw), ref(k, kw_)
                rows.append(row("qk_rope_kv_store", case + " q", ops.to_numpy(Q), rq, 1e-6))
                rows.append(row("qk_rope_kv_store", case + " k", ops.to_numpy(Kx), rk, 1e-6))
                kc_h, vc_h = ops.to_numpy(kc).astype(np.float64), ops.to_numpy(vc).astype(np.float64)
                want_k, want_v = np.zeros_like(kc_h), np.zeros_like(vc_h)
                want_k[:, slots] = rk.transpose(1, 0, 2)
                want_v[:, slots] = v.astype(np.float64).transpose(1, 0, 2)
                rows.append(row("qk_rope_kv_store", case + " K cache", kc_h, want_k, kv_tol))
                rows.append(row("qk_rope_kv_store", case + " V cache", vc_h, want_v, kv_tol))
                # the plain ops on the same backend: same values, same cache bits
                Q2, K2 = ops.asarray(q.copy()), ops.asarray(k.copy())
                kc2, vc2 = ops.zeros((Hkv, n_slots, hd), ops.kv_dtype), ops.zeros((Hkv, n_slots, hd), ops.kv_dtype)
                if norm:
                    ops.rms_norm_rope(Q2, QW, 1e-6, pos, **rope)
                    ops.rms_norm_rope(K2, KW, 1e-6, pos, **rope)
                else:
                    ops.rope(Q2, pos, inplace=True, **rope)
                    ops.rope(K2, pos, inplace=True, **rope)
                ops.kv_store(kc2, vc2, K2, ops.asarray(v.copy()), slots)
                rows.append(row("qk_rope_kv_store", case + " q vs plain ops", ops.to_numpy(Q), ops.to_numpy(Q2), 1e-6))
                rows.append(row("qk_rope_kv_store", case + " K cache vs plain ops", kc_h,
                                ops.to_numpy(kc2).astype(np.float64), 1e-3 if ops.kv_dtype == "float16" else 1e-6))
                if N == 1 and hasattr(ops, "capture"):
                    q2 = (rng.standard_normal((N, Hq, hd)) * 2).astype(np.float32)
                    kc3, vc3 = ops.zeros((Hkv, n_slots, hd), ops.kv_dtype), ops.zeros((Hkv, n_slots, hd), ops.kv_dtype)
                    Q3, K3, V3 = ops.asarray(q.copy()), ops.asarray(k.copy()), ops.asarray(v.copy())
                    g, _ = ops.capture(lambda: run(Q3, K3, V3, kc3, vc3))
                    try:
                        ops.write(Q3, q2)
                        ops.write(K3, k)
                        g.launch()
                        rows.append(row("qk_rope_kv_store", case + " graph q", ops.to_numpy(Q3), ref(q2, qw), 1e-6))
                        rows.append(row("qk_rope_kv_store", case + " graph K cache",
                                        ops.to_numpy(kc3).astype(np.float64), want_k, kv_tol))
                    finally:
                        g.close()
    return rows


def _flash_count(ops):
    return getattr(ops, "flash_launches", 0)


def _att_tol(ops, before):
    """1e-5 for the float32 attention kernels, FLASH_TOL when the call just made ran the
    tensor-core kernel (ops.flash_launches moved past `before`)."""
    return FLASH_TOL if _flash_count(ops) > before else 1e-5


def check_attention(ops, rng):
    rows = []
    n_ctx = 300
    for hd, Hq, Hkv in ((64, 8, 2), (128, 16, 8), (256, 4, 1)):
        cache = (ops.zeros((Hkv, n_ctx, hd), ops.kv_dtype), ops.zeros((Hkv, n_ctx, hd), ops.kv_dtype))
        past = 41
        N = 23
        n_kv = past + N
        k = rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32)
        v = rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32)
        # the past in one store, the new tokens in another
        ops.kv_store(*cache, ops.asarray(k[:past]), ops.asarray(v[:past]), np.arange(past))
        ops.kv_store(*cache, ops.asarray(k[past:]), ops.asarray(v[past:]), np.arange(past, n_kv))
        Kc = k.astype(np.float16).astype(np.float64).transpose(1, 0, 2)
        Vc = v.astype(np.float16).astype(np.float64).transpose(1, 0, 2)
        kc = ops.to_numpy(cache[0]).astype(np.float64)[:, :n_kv]
        rows.append(row("kv_store", f"hd={hd}", kc, Kc, 0.0))
        q = rng.standard_normal((N, Hq, hd)).astype(np.float32)
        pos = np.arange(past, n_kv)
        scale = 1 / np.sqrt(hd)
        cases = [("prefill causal", dict(causal=True)),
                 ("prefill window=16", dict(causal=True, window=16)),
                 ("prefill softcap=5", dict(causal=True, softcap=5.0))]
        for name, kw in cases:
            before = _flash_count(ops)
            out = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=scale, **kw))
            ref = attention_ref(q.astype(np.float64), Kc, Vc, pos, n_kv, scale, kw.get("softcap", 0),
                                True, kw.get("window", 0), None)
            rows.append(row("attention", f"hd={hd} Hq={Hq} Hkv={Hkv} {name}", out, ref, _att_tol(ops, before)))
        # decode: one query at the last position
        out = ops.to_numpy(ops.attention(ops.asarray(q[-1:]), *cache, pos[-1:], n_kv, scale=scale))
        ref = attention_ref(q[-1:].astype(np.float64), Kc, Vc, pos[-1:], n_kv, scale, 0, True, 0, None)
        rows.append(row("attention", f"hd={hd} Hq={Hq} Hkv={Hkv} decode", out, ref, 1e-5))
        # explicit additive mask, not causal
        mask = np.where(rng.random((N, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)
        mask[:, 0] = 0
        before = _flash_count(ops)
        out = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=scale, causal=False,
                                         mask=ops.asarray(mask)))
        ref = attention_ref(q.astype(np.float64), Kc, Vc, pos, n_kv, scale, 0, False, 0, mask.astype(np.float64))
        rows.append(row("attention", f"hd={hd} mask non-causal", out, ref, _att_tol(ops, before)))
    # decode over a long cache (the split-K path: few blocks, many keys), with a window and a mask
    hd, Hq, Hkv, n_ctx = 128, 8, 2, 2048
    cache = (ops.zeros((Hkv, n_ctx, hd), ops.kv_dtype), ops.zeros((Hkv, n_ctx, hd), ops.kv_dtype))
    n_kv = 1500
    k = rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32)
    ops.kv_store(*cache, ops.asarray(k), ops.asarray(v), np.arange(n_kv))
    Kc = k.astype(np.float16).astype(np.float64).transpose(1, 0, 2)
    Vc = v.astype(np.float16).astype(np.float64).transpose(1, 0, 2)
    q = rng.standard_normal((2, Hq, hd)).astype(np.float32)
    pos = np.array([n_kv - 2, n_kv - 1])
    for name, kw in (("causal", {}), ("window=300", {"window": 300}), ("softcap=5", {"softcap": 5.0})):
        out = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=0.09, **kw))
        ref = attention_ref(q.astype(np.float64), Kc, Vc, pos, n_kv, 0.09, kw.get("softcap", 0), True,
                            kw.get("window", 0), None)
        rows.append(row("attention", f"split-K decode n_kv={n_kv} {name}", out, ref, 1e-5))
    mask = np.where(rng.random((2, n_kv)) < 0.5, -np.inf, 0.0).astype(np.float32)
    out = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=0.09, causal=False,
                                     mask=ops.asarray(mask)))
    ref = attention_ref(q.astype(np.float64), Kc, Vc, pos, n_kv, 0.09, 0, False, 0, mask.astype(np.float64))
    rows.append(row("attention", f"split-K decode n_kv={n_kv} mask", out, ref, 1e-5))
    # the split launch against the two-kernel form (REFLEX_FUSE=0: split + combine kernels)
    fused = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=0.09))
    with settings.override(fuse=False):
        plain = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=0.09))
    rows.append(row("attention", f"split-K decode n_kv={n_kv} vs REFLEX_FUSE=0", fused, plain, 1e-6))
    # replayed from a graph, new queries each time (CUDA's split launch leaves its tickets at 0)
    if hasattr(ops, "capture"):
        Q, P = ops.asarray(q), ops.positions(pos)
        g, out = ops.capture(lambda: ops.attention(Q, *cache, P, n_kv, scale=0.09))
        try:
            for i in range(3):
                qi = rng.standard_normal(q.shape).astype(np.float32)
                ops.write(Q, qi)
                g.launch()
                ref = attention_ref(qi.astype(np.float64), Kc, Vc, pos, n_kv, 0.09, 0, True, 0, None)
                rows.append(row("attention", f"split-K decode n_kv={n_kv} graph replay {i}", ops.to_numpy(out), ref,
                                1e-5))
        finally:
            g.close()
    return rows


def check_attention_sinks_chunks(ops, rng):
    """gpt-oss's attention sinks and Llama 4's chunked attention in every form of attention
    (CUDA: the split-key decode, fused and two-kernel; the tensor-core prefill, one share and
    split over key shares; attention_f16kv with flash off; a mask; a captured graph) against
    the float64 reference, sinks large enough to take a real share of the softmax."""
    rows = []
    hd, Hq, Hkv, ctx = 64, 16, 2, 2400
    cache = (ops.zeros((Hkv, ctx, hd), ops.kv_dtype), ops.zeros((Hkv, ctx, hd), ops.kv_dtype))
    n_all = 2200
    k = rng.standard_normal((n_all, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((n_all, Hkv, hd)).astype(np.float32)
    ops.kv_store(*cache, ops.asarray(k), ops.asarray(v), np.arange(n_all))
    Kc, Vc = (ops.to_numpy(c)[:, :n_all].astype(np.float64) for c in cache)  # as stored (f16 or f32)
    sinks = rng.uniform(-1.0, 3.0, Hq).astype(np.float32)
    S = ops.asarray(sinks)
    scale = 1 / np.sqrt(hd)

    def one(case, N, n_kv, kw, tol=None, mask=None, flash=True):
        q = rng.standard_normal((N, Hq, hd)).astype(np.float32)
        pos = np.arange(n_kv - N, n_kv)
        ref = attention_ref(q.astype(np.float64), Kc, Vc, pos, n_kv, scale, 0.0, mask is None, kw.get("window", 0),
                            None if mask is None else mask.astype(np.float64),
                            sinks if kw.get("sinks") is not None else None, kw.get("chunk", 0))
        before = _flash_count(ops)
        old = getattr(ops, "flash", None)
        if old is not None and not flash:
            ops.flash = False
        try:
            out = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, scale=scale, causal=mask is None,
                                             mask=None if mask is None else ops.asarray(mask), **kw))
        finally:
            if old is not None:
                ops.flash = old
        rows.append(row("attention", case, out, ref, tol if tol is not None else _att_tol(ops, before)))

    for label, kw in (("sinks", dict(sinks=S)), ("chunk=512", dict(chunk=512)),
                      ("sinks chunk=512", dict(sinks=S, chunk=512)), ("sinks window=300", dict(sinks=S, window=300))):
        one(f"split-K decode n_kv=2200 {label}", 1, 2200, kw, 1e-5)
        one(f"split-K decode n_kv=1025 {label}", 2, 1025, kw, 1e-5)
        with settings.override(fuse=False):
            one(f"split-K decode (split + combine) n_kv=2200 {label}", 1, 2200, kw, 1e-5)
        one(f"prefill N=100 n_kv=700 {label}", 100, 700, kw)
        one(f"prefill N=100 n_kv=700 {label} attention_f16kv", 100, 700, kw, 1e-5, flash=False)
        one(f"prefill N=16 n_kv=2200 (key shares) {label}", 16, 2200, kw)
        one(f"prefill N=517 n_kv=1030 {label}", 517, 1030, kw)
    mask = np.where(rng.random((40, 900)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, 0] = 0
    mask[3] = -np.inf  # nothing visible: zeros whatever the sink
    one("masked N=40 n_kv=900 sinks", 40, 900, dict(sinks=S), mask=mask)
    one("masked N=2 n_kv=900 sinks (split-K)", 2, 900, dict(sinks=S), 1e-5, mask=mask[:2])
    if hasattr(ops, "capture"):
        q = rng.standard_normal((1, Hq, hd)).astype(np.float32)
        Q, P = ops.asarray(q), ops.positions(np.array([1999], np.int32))
        g, out = ops.capture(lambda: ops.attention(Q, *cache, P, n_all, scale=scale, sinks=S, chunk=512))
        try:
            for i, p in enumerate((1999, 2047, 2048, 2199)):
                qi = rng.standard_normal(q.shape).astype(np.float32)
                ops.write(Q, qi)
                ops.write(P, np.array([p], np.int32))
                g.launch()
                ref = attention_ref(qi.astype(np.float64), Kc, Vc, [p], p + 1, scale, 0.0, True, 0, None, sinks, 512)
                rows.append(row("attention", f"graph replay pos={p} sinks chunk=512", ops.to_numpy(out), ref, 1e-5))
        finally:
            g.close()
    return rows


def check_archops(ops, rng):
    """pos_scale (Llama 4's attention temperature) on positions around its floor steps, and moe's
    gpt-oss form (router bias, softmax_weight gating, expert biases, swiglu_oai: a clamp that
    bites) and Llama 4's (sigmoid, the weight before the experts, k = 1 and 2) against
    NumpyOps.moe on the same dequantized weights, also inside a captured graph."""
    from reflex_ipc.backends.numpy_ops import NumpyOps

    npo = NumpyOps()
    rows = []
    # the cpu backend rounds activations to int8 blocks (twice: x, then the glu for the down
    # products), through the clamps and gates of these units: a few % of the outputs' norm
    tol = 5e-2 if ops.name == "cpu" else 1e-4
    x = rng.standard_normal((7, 4, 16)).astype(np.float32)
    pos = np.array([0, 8190, 8191, 8192, 16383, 40000, 100000], np.int32)
    got = ops.to_numpy(ops.pos_scale(ops.asarray(x), pos, floor=8192.0, scale=0.1, offset=1.0))
    rows.append(row("pos_scale", "floor 8192 scale 0.1", got, npo.pos_scale(x, pos, floor=8192.0, scale=0.1), 1e-7))
    E, K, D = 8, 256, 256
    for label, kw, k, fmt in (("gpt-oss-like", dict(gating="softmax_weight", norm=False, act="swiglu_oai",
                                                    oai=True), 4, "Q8_0"),
                              ("gpt-oss-like F32", dict(gating="softmax_weight", norm=False, act="swiglu_oai",
                                                        oai=True), 2, "F32"),
                              ("llama4-like k=1", dict(gating="sigmoid", norm=False, weight_before=True), 1, "Q4_K"),
                              ("llama4-like k=2", dict(gating="sigmoid", norm=False, weight_before=True), 2, "F16")):
        F = 256 if fmt.endswith("_K") else 224
        W = _weights(ops, {"gate": (fmt, E * F, K), "up": (fmt, E * F, K), "down": (fmt, E * D, F),
                           "router": ("F32", E, K)}, rng)
        ref = {key: v[1].astype(np.float32) for key, v in W.items()}
        kw = dict(kw)
        extra_np, extra = {}, {}
        if kw.pop("oai", False):
            b = {"router_bias": rng.standard_normal(E) * 0.5, "gate_bias": rng.standard_normal((E, F)) * 2,
                 "up_bias": rng.standard_normal((E, F)) * 2, "down_bias": rng.standard_normal((E, D)) * 0.5}
            extra_np = {n: a.astype(np.float32) for n, a in b.items()}
            extra = {n: ops.asarray(a) for n, a in extra_np.items()}
        for N in (1, 5):
            xx = (rng.standard_normal((N, K)) * 3).astype(np.float32)  # gate values past the clamp of 7
            want = npo.moe(xx, ref["router"], ref["gate"], ref["up"], ref["down"], k, **kw, **extra_np)
            got = ops.moe(ops.asarray(xx), W["router"][0], W["gate"][0], W["up"][0], W["down"][0], k, **kw, **extra)
            rows.append(row("moe", f"{label} {fmt} k={k} N={N}", ops.to_numpy(got), want, tol))
        if hasattr(ops, "capture"):
            X = ops.empty((3, K))
            graph, out = ops.capture(lambda: ops.moe(X, W["router"][0], W["gate"][0], W["up"][0], W["down"][0], k,
                                                     **kw, **extra))
            try:
                for rep in range(2):
                    xx = (rng.standard_normal((3, K)) * 3).astype(np.float32)
                    ops.write(X, xx)
                    graph.launch()
                    want = npo.moe(xx, ref["router"], ref["gate"], ref["up"], ref["down"], k, **kw, **extra_np)
                    rows.append(row("moe", f"{label} graph replay {rep}", ops.to_numpy(out), want, tol))
            finally:
                graph.close()
    return rows


def flash_row(case, out, ref, op="flash_attention"):
    """A row of check_flash_attention: FLASH_TOL on the norm-relative error and FLASH_MAX_TOL on
    the largest element difference relative to max |ref|."""
    r = row(op, case, out, ref, FLASH_TOL)
    peak = float(np.max(np.abs(ref))) or 1.0
    r["max_rel"] = r["max_abs"] / peak
    r["ok"] = bool(r["ok"] and r["max_rel"] <= FLASH_MAX_TOL)
    return r


# (N, hd, Hq, Hkv, keys before the queries, options): the tensor-core attention's cases. Hq = 16
# keeps N * Hq >= ATT_SPLIT_BELOW, so CudaOps takes the flash kernel, not the split-key one.
FLASH_CASES = [
    (16, 128, 16, 8, 0, {}),
    (17, 64, 16, 16, 0, {}),
    (64, 256, 16, 2, 0, {}),
    (100, 128, 16, 2, 0, {}),
    (512, 128, 16, 8, 0, {}),
    (512, 64, 16, 2, 0, {}),
    (100, 256, 16, 16, 0, {}),
    (100, 128, 16, 8, 300, {}),  # a later prefill chunk: keys of earlier chunks before it
    (64, 64, 16, 2, 1000, {}),
    (512, 256, 16, 8, 512, {}),
    (100, 128, 16, 8, 60, {"window": 50}),
    (512, 256, 16, 2, 0, {"window": 128}),
    (64, 256, 16, 8, 20, {"softcap": 5.0}),
    (100, 64, 16, 2, 30, {"window": 40, "softcap": 30.0}),
    (100, 64, 16, 2, 30, {"causal": False}),
    (17, 128, 16, 8, 40, {"mask": True}),
    (100, 256, 16, 2, 40, {"mask": True}),
    (64, 64, 16, 16, 200, {"mask": True}),
    # few row tiles over many keys: CudaOps splits the keys over blocks (attention_combine merges)
    (16, 128, 16, 8, 2000, {"split": True}),
    (24, 64, 16, 2, 1500, {"mask": True, "split": True}),
    (32, 256, 16, 2, 1200, {"window": 300, "split": True}),
    (40, 128, 16, 8, 1100, {"softcap": 20.0, "split": True}),
]


def check_flash_attention(ops, rng):
    """The tensor-core prefill attention (CUDA: flash.cuh) on FLASH_CASES against float64 and
    against the float32 kernel (attention_f16kv, ops.flash off), and that the flash kernel ran.
    Cache slots at and past n_kv hold inf (1e6 as f16): a read of one there shows as inf/NaN."""
    rows = []
    for N, hd, Hq, Hkv, past, kw in FLASH_CASES:
        kw = dict(kw)
        n_kv = past + N
        ctx = n_kv + 37
        causal = kw.pop("causal", True)
        softcap, window = kw.pop("softcap", 0.0), kw.pop("window", 0)
        split = kw.pop("split", False)
        cache = (ops.zeros((Hkv, ctx, hd), ops.kv_dtype), ops.zeros((Hkv, ctx, hd), ops.kv_dtype))
        k = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
        v = rng.standard_normal((ctx, Hkv, hd)).astype(np.float32)
        k[n_kv:] = 1e6
        v[n_kv:] = 1e6
        ops.kv_store(*cache, ops.asarray(k), ops.asarray(v), np.arange(ctx))
        Kc = k[:n_kv].astype(np.float16).astype(np.float64).transpose(1, 0, 2)
        Vc = v[:n_kv].astype(np.float16).astype(np.float64).transpose(1, 0, 2)
        q = (rng.standard_normal((N, Hq, hd)) * 1.5).astype(np.float32)
        pos = np.arange(past, n_kv)
        scale = 1 / np.sqrt(hd)
        mask = None
        if kw.pop("mask", False):
            causal = False
            mask = np.where(rng.random((N, n_kv)) < 0.4, -np.inf, 0.0).astype(np.float32)
            mask[:, n_kv - 1] = 0
            mask[1] = -np.inf
            mask[1, n_kv // 2] = 0  # one visible key
            mask[2] = -np.inf  # none: zeros
        assert not kw, kw
        name = (f"N={N} hd={hd} Hq={Hq} Hkv={Hkv} past={past}" + ("" if causal else " non-causal")
                + (f" window={window}" if window else "") + (f" softcap={softcap}" if softcap else "")
                + (" mask" if mask is not None else ""))
        ref = attention_ref(q.astype(np.float64), Kc, Vc, pos, n_kv, scale, softcap, causal, window,
                            None if mask is None else mask.astype(np.float64))
        args = dict(scale=scale, softcap=softcap, causal=causal, window=window,
                    mask=None if mask is None else ops.asarray(mask))
        before = _flash_count(ops)
        out = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, **args))
        rows.append(flash_row(name, out, ref))
        if mask is not None:
            rows.append(row("flash_attention", name + ": row with no visible key is 0", out[2], np.zeros_like(out[2]),
                            0.0))
        if getattr(ops, "flash", False):  # CUDA on sm_80+ unless REFLEX_FLASH=0
            S = ops.flash_last_splits
            # a case marked split must split; the others may or may not (it depends on the SM count:
            # on the H200's 132 SMs a 64-query, 2-kv-head batch over 1000 keys splits too)
            rows.append({"op": "flash_attention", "case": name + f": flash kernel ran, {S} key share(s)",
                         "ok": _flash_count(ops) == before + 1 and (S > 1 or not split)})
            ops.flash = False
            try:
                plain = ops.to_numpy(ops.attention(ops.asarray(q), *cache, pos, n_kv, **args))
            finally:
                ops.flash = True
            rows.append(flash_row(name + " vs attention_f16kv", out, plain))
    return rows


def check_mla(ops, rng):
    """The multi-head latent attention ops (deepseek2; mla.cuh on CUDA) against numpy / float64:
    split and concat (odd widths), head_matmul of every weight format, YaRN rope, keys-only
    kv_store and attention over the latent cache (values = the first v_dim key dims; prefill,
    split-K decode, mask), and a decode step of them replayed from a captured graph."""
    from reflex_ipc.backends.numpy_ops import NumpyOps

    ref_ops = NumpyOps(blas_threads=None)
    rows = []
    # split / concat
    for shape, sizes in (((1, 3, 12), (7, 5)), ((5, 3, 13), (7, 5, 1)), ((13, 16, 192), (128, 64)),
                         ((4, 37), (1, 35, 1))):
        x = rng.standard_normal(shape).astype(np.float32)
        poison(ops, *[shape[:-1] + (n,) for n in sizes])
        parts = ops.split(ops.asarray(x), list(sizes))
        for i, (got, want) in enumerate(zip(parts, ref_ops.split(x, list(sizes)))):
            rows.append(row("split", f"{shape} {sizes} part{i}", ops.to_numpy(got), want, 0.0))
        poison(ops, shape)
        back = ops.concat(parts)
        rows.append(row("concat", f"{shape} {sizes}", ops.to_numpy(back), x, 0.0))
    # head_matmul: x [N, H, K] by a weight [H*M, K]
    specs = [(t, 3, 37, 256) for t in MM_TYPES] + [("F32", 4, 16, 8), ("F32", 4, 12, 16), ("F16", 16, 512, 128),
                                                    ("Q8_0", 16, 128, 512)]
    for t, H, M, K in specs:
        W = _weights(ops, {"w": (t, H * M, K)}, rng)
        w, ref = W["w"]
        for N in (1, 5, 8, 13):
            x = rng.standard_normal((N, H, K)).astype(np.float32)
            poison(ops, (N, H, M))
            got = ops.to_numpy(ops.head_matmul(ops.asarray(x), w))
            want = np.einsum("nhk,hmk->nhm", x.astype(np.float64), ref.reshape(H, M, K))
            # the cpu backend rounds activations to int8 blocks for quantized weights (cpu_ops.py)
            tol = CPU_ACT_TOL if ops.name == "cpu" and t not in ("F32", "F16", "BF16") else 2e-5
            rows.append(row("head_matmul", f"{t} H={H} M={M} K={K} N={N}", got, want, tol))
    # YaRN rope (deepseek2's arguments and others), against numpy's rope
    cases = [  # hd, n_rot, H, freq_scale, yarn (ext, n_ctx_orig, beta_fast, beta_slow), mscale, neox, ff
        (8, 8, 4, 0.25, (1.0, 32, 32.0, 1.0), 0.93, False, False),
        (64, 64, 16, 1 / 40, (1.0, 4096, 32.0, 1.0), 1.0, False, False),
        (24, 8, 1, 0.125, (1.0, 16, 32.0, 1.0), 1.1, False, False),
        (128, 96, 3, 0.5, (0.5, 2048, 16.0, 2.0), 1.0, True, True),
    ]
    for hd, n_rot, H, fs, yarn, mscale, neox, ff in cases:
        for N in (1, 5, 13):
            x = (rng.standard_normal((N, H, hd)) * 2).astype(np.float32)
            pos = np.array([0, 1, 7, 100, 2047, 30000, 5, 9, 11, 13, 17, 4095, 12345][:N], np.int32)
            factors = rng.uniform(1, 4, n_rot // 2).astype(np.float32) if ff else None
            kw = dict(n_rot=n_rot, base=10000.0, freq_scale=fs, neox=neox, mscale=mscale, yarn=yarn)
            want = ref_ops.rope(x.copy(), pos, freq_factors=factors, **kw)
            X = ops.asarray(x.copy())
            got = ops.rope(X, pos, inplace=True, freq_factors=ops.asarray(factors) if ff else None, **kw)
            case = f"hd={hd} n_rot={n_rot} H={H} N={N} fs={fs:.4g} yarn={yarn} neox={neox} ff={ff}"
            rows.append({"op": "rope_yarn", "case": case + " returns x", "ok": got is X})
            rows.append(row("rope_yarn", case, ops.to_numpy(X), want, 2e-6))
            got2 = ops.rope(ops.asarray(x.copy()), pos, freq_factors=ops.asarray(factors) if ff else None, **kw)
            rows.append(row("rope_yarn", case + " copy", ops.to_numpy(got2), want, 2e-6))
    # attention over the latent cache, in the backend's KV dtype and in its exact one (float32 on
    # CUDA: deepseek2's latent, SlotSpec(exact=True); issue 32 item 18)
    dtypes = [ops.kv_dtype] + [d for d in (getattr(ops, "exact_kv_dtype", None),) if d and d != ops.kv_dtype]
    for (R, r, H, n_ctx), kv_dtype in ((c, d) for c in ((16, 8, 4, 64), (512, 64, 16, 300), (40, 8, 3, 97))
                                        for d in dtypes):
        dk = R + r
        cache = ops.zeros((1, n_ctx, dk), kv_dtype)
        past, N = min(41, n_ctx // 3), 23
        n_kv = past + N
        lat = rng.standard_normal((n_kv, 1, dk)).astype(np.float32)
        ops.kv_store(cache, None, ops.asarray(lat[:past]), None, np.arange(past))
        ops.kv_store(cache, None, ops.asarray(lat[past:]), None, np.arange(past, n_kv))
        Kc = lat.astype(kv_dtype).astype(np.float64).transpose(1, 0, 2)  # [1, n_kv, dk]
        rows.append(row("kv_store", f"latent dk={dk} {kv_dtype}", ops.to_numpy(cache).astype(np.float64)[:, :n_kv],
                        Kc, 0.0))
        q = rng.standard_normal((N, H, dk)).astype(np.float32)
        pos = np.arange(past, n_kv)
        scale = 1 / np.sqrt(dk)
        for name, qq, pp, kw in (("prefill", q, pos, {}), ("decode", q[-1:], pos[-1:], {}),
                                 ("prefill softcap=5", q, pos, {"softcap": 5.0})):
            poison(ops, (len(pp), H, R))
            got = ops.to_numpy(ops.attention(ops.asarray(qq), cache, None, pp, n_kv, scale=scale, v_dim=R, **kw))
            want = attention_ref(qq, Kc, Kc[:, :, :R], pp, n_kv, scale, kw.get("softcap", 0.0), True, 0, None)
            rows.append(row("latent_attention", f"R={R} r={r} H={H} {name} {kv_dtype}", got, want, 1e-5))
        mask = np.where(rng.random((N, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)
        mask[:, 0] = 0
        mask[3] = -np.inf  # a query that sees nothing: zeros
        got = ops.to_numpy(ops.attention(ops.asarray(q), cache, None, pos, n_kv, scale=scale, causal=False,
                                         mask=ops.asarray(mask), v_dim=R))
        want = attention_ref(q, Kc, Kc[:, :, :R], pos, n_kv, scale, 0.0, False, 0, mask.astype(np.float64))
        rows.append(row("latent_attention", f"R={R} r={r} H={H} mask non-causal {kv_dtype}", got, want, 1e-5))
    # split-K decode over a long latent cache (DeepSeek-V2-Lite's widths), causal and masked
    R, r, H, n_ctx, n_kv = 512, 64, 16, 2048, 1500
    dk = R + r
    cache = ops.zeros((1, n_ctx, dk), ops.kv_dtype)
    lat = rng.standard_normal((n_kv, 1, dk)).astype(np.float32)
    ops.kv_store(cache, None, ops.asarray(lat), None, np.arange(n_kv))
    Kc = lat.astype(ops.kv_dtype).astype(np.float64).transpose(1, 0, 2)
    q = rng.standard_normal((2, H, dk)).astype(np.float32)
    pos = np.array([n_kv - 2, n_kv - 1])
    got = ops.to_numpy(ops.attention(ops.asarray(q), cache, None, pos, n_kv, scale=0.05, v_dim=R))
    want = attention_ref(q, Kc, Kc[:, :, :R], pos, n_kv, 0.05, 0.0, True, 0, None)
    rows.append(row("latent_attention", f"split-K decode n_kv={n_kv}", got, want, 1e-5))
    mask = np.where(rng.random((2, n_kv)) < 0.5, -np.inf, 0.0).astype(np.float32)
    got = ops.to_numpy(ops.attention(ops.asarray(q), cache, None, pos, n_kv, scale=0.05, causal=False,
                                     mask=ops.asarray(mask), v_dim=R))
    want = attention_ref(q, Kc, Kc[:, :, :R], pos, n_kv, 0.05, 0.0, False, 0, mask.astype(np.float64))
    rows.append(row("latent_attention", f"split-K decode n_kv={n_kv} mask", got, want, 1e-5))
    for kv_dtype in dtypes:
        rows += _check_mla_step(ops, ref_ops, rng, kv_dtype)
    return rows


def check_mla_prefill(ops, rng):
    """base.latent_attention on the backend (CUDA's mla_attention: for 128+ queries the latents
    decompressed per head by tensor-core GEMMs, attn_k_b transposed to f16, and the flash kernel
    at key / value widths 192 / 128) against numpy's absorbed form in float64 on the same
    dequantized weights: DeepSeek-V2-Lite's heads (16 x (128 + 64), v 128, latent 512) with Q8_0 /
    Q4_K / F16 attn_k_b and attn_v_b, a first chunk, a second chunk over the first's keys (split
    keys when its row tiles are few), a masked (system1-like) batch. On a backend with the
    decompressed path (mla_flash), each call must have taken it (mla_flash_launches); tolerance
    FLASH_TOL on the norm and FLASH_MAX_TOL on the largest element (K, V, q and p in f16)."""
    kv16 = getattr(ops, "kv_dtype", "float32")
    exact = getattr(ops, "exact_kv_dtype", None) or kv16  # deepseek2's latent (SlotSpec(exact=True))
    return _mla_prefill_rows(ops, rng, (("Q8_0", "Q8_0", (200, 130), False, exact),
                                        ("F16", "Q4_K", (128,), False, kv16),
                                        ("Q8_0", "Q8_0", (160,), True, exact),
                                        ("Q8_0", "Q6_K", (1000, 128), False, kv16)))


def _mla_prefill_rows(ops, rng, cases, op="mla_prefill", tol=1e-4):
    """check_mla_prefill's rows for cases (attn_k_b format, attn_v_b format, chunk sizes, masked,
    cache dtype); tol: the bound where the backend has no decompressed path."""
    from reflex_ipc.backends.base import latent_attention
    from reflex_ipc.backends.numpy_ops import NumpyOps

    ref_ops = NumpyOps(blas_threads=None)
    rows = []
    flash = getattr(ops, "mla_flash", False)
    H, nope, r, R, dv = 16, 128, 64, 512, 128
    scale = 1 / np.sqrt(nope + r)
    for tk, tv, chunks, masked, cdt in cases:
        W = _weights(ops, {"kb": (tk, H * R, nope), "vb": (tv, H * dv, R)}, rng)
        (wk, kb), (wv, vb) = W["kb"], W["vb"]
        n_ctx = sum(chunks) + 8
        cache = ops.zeros((1, n_ctx, R + r), cdt)
        cache_ref = np.zeros((1, n_ctx, R + r), np.float32)
        start = 0
        for N in chunks:
            pos = np.arange(start, start + N, dtype=np.int32)
            lat = rng.standard_normal((N, 1, R + r)).astype(np.float16).astype(np.float32)
            ops.kv_store(cache, None, ops.asarray(lat), None, ops.positions(pos))
            cache_ref[0, pos] = lat[:, 0]
            q_nope = rng.standard_normal((N, H, nope)).astype(np.float32)
            q_pe = rng.standard_normal((N, H, r)).astype(np.float32)
            n_kv = start + N
            kw = {"causal": True, "window": 0, "mask": None}
            if masked:  # each query sees a random half of the keys (and its own)
                allowed = rng.random((N, n_kv)) < 0.5
                allowed[np.arange(N), pos] = True
                m = np.where(allowed, 0.0, -np.inf).astype(np.float32)
                kw = {"causal": False, "window": 0, "mask": m}
            want = latent_attention(ref_ops, q_nope.astype(np.float64), q_pe.astype(np.float64), cache_ref, kb, vb,
                                    pos, n_kv, scale=scale, **kw)
            before = getattr(ops, "mla_flash_launches", 0)
            dkw = dict(kw, mask=None if kw["mask"] is None else ops.asarray(kw["mask"]))
            got = ops.to_numpy(latent_attention(ops, ops.asarray(q_nope), ops.asarray(q_pe), cache, wk, wv,
                                                ops.positions(pos), n_kv, scale=scale, **dkw))
            case = f"k_b {tk} v_b {tv} N={N} keys={n_kv} cache {cdt}" + (" masked" if masked else "")
            took = getattr(ops, "mla_flash_launches", 0) == before + 1
            r_ = flash_row(case, got, want, op=op) if flash else row(op, case, got, want, tol)
            if flash and N >= ops.mla_flash_min_n and not took:
                r_["ok"], r_["error"] = False, "the decompressed path was not taken"
            rows.append(r_)
            start += N
    return rows


def _check_mla_step(ops, ref_ops, rng, kv_dtype=None):
    """deepseek2's attention step (split, YaRN rope, head_matmul, concat, keys-only kv_store,
    latent attention, head_matmul) for decode tokens at growing positions: eager on `ops`,
    replayed from one captured graph (when ops can capture), against numpy."""
    H, nope, r, R, v_dim, n_ctx = 4, 8, 8, 16, 12, 40
    W = _weights(ops, {"k_b": ("F32", H * R, nope), "v_b": ("F32", H * v_dim, R)}, rng)
    ref_w = {k: np.asarray(v[1], np.float32) for k, v in W.items()}
    rope = dict(n_rot=r, base=10000.0, freq_scale=0.25, neox=False, mscale=0.9, yarn=(1.0, 32, 32.0, 1.0))
    scale = 0.3

    def step(o, kb, vb, q, lat, pe, pos, cache):
        q_nope, q_pe = o.split(q, [nope, r])
        q_pe = o.rope(q_pe, pos, inplace=True, **rope)
        qq = o.concat([o.head_matmul(q_nope, kb), q_pe])
        pe = o.rope(pe, pos, inplace=True, **rope)
        o.kv_store(cache, None, o.concat([lat, pe]), None, pos)
        att = o.attention(qq, cache, None, pos, n_ctx, scale=scale, v_dim=R, causal=True, window=0, mask=None)
        return o.head_matmul(att, vb)

    n_steps = 12
    qs = rng.standard_normal((n_steps, 1, H, nope + r)).astype(np.float32)
    lats = rng.standard_normal((n_steps, 1, 1, R)).astype(np.float32)
    pes = rng.standard_normal((n_steps, 1, 1, r)).astype(np.float32)
    ref_cache = ref_ops.zeros((1, n_ctx, R + r), "float32")
    want = [step(ref_ops, ref_w["k_b"], ref_w["v_b"], qs[i].copy(), lats[i], pes[i].copy(),
                 np.array([i], np.int32), ref_cache) for i in range(n_steps)]
    rows = []
    kv_dtype = kv_dtype or ops.kv_dtype
    # a float32 latent cache leaves only float32 rounding: 100x tighter than the f16 cache's bound
    tol, tag = (2e-5, " float32 latent") if kv_dtype == "float32" else (2e-3, "")
    cache = ops.zeros((1, n_ctx, R + r), kv_dtype)
    # copies: a host backend's asarray may return the array itself, which rope then rotates
    got = [ops.to_numpy(step(ops, W["k_b"][0], W["v_b"][0], ops.asarray(qs[i].copy()), ops.asarray(lats[i]),
                             ops.asarray(pes[i].copy()), ops.positions([i]), cache)) for i in range(n_steps)]
    rows.append(row("mla_step", "eager decode steps" + tag, np.stack(got), np.stack(want), tol))
    if not callable(getattr(ops, "capture", None)):
        return rows
    cache = ops.zeros((1, n_ctx, R + r), kv_dtype)
    Q, LAT, PE = ops.empty((1, H, nope + r)), ops.empty((1, 1, R)), ops.empty((1, 1, r))
    POS = ops.positions([0])
    graph, out = ops.capture(lambda: step(ops, W["k_b"][0], W["v_b"][0], Q, LAT, PE, POS, cache))
    got = []
    try:
        for i in range(n_steps):
            ops.write(Q, qs[i])
            ops.write(LAT, lats[i])
            ops.write(PE, pes[i])
            ops.write(POS, np.array([i], np.int32))
            graph.launch()
            got.append(np.array(ops.to_numpy(out)))  # a copy: on a host backend, out itself
    finally:
        graph.close()
    rows.append(row("mla_step", "captured graph decode steps" + tag, np.stack(got), np.stack(want), tol))
    return rows


def check_sampling(ops, rng):
    rows = []
    for n in (1000, 1001, 49152, 151936, 262144):
        x = rng.standard_normal((3, n)).astype(np.float32)
        x[1, 10] = x[1, 20] = x[1].max() + 1  # a tie: the first index wins
        x[2, n - 2] = x[2, n - 1] = x[2].max() + 1  # a tie in the last elements (n odd: the scalar tail)
        x[1, 5] = np.nan  # NaN counts as -inf (row 1: the top-k checks below read row 0)
        got = ops.argmax(ops.asarray(x))
        ref = np.argmax(np.where(np.isnan(x), -np.inf, x), axis=-1)
        rows.append({"op": "argmax", "case": f"n={n}", "ok": bool(np.array_equal(got, ref)),
                     "got": got.tolist(), "ref": ref.tolist()})
        for k in (1, 20, 64):
            gi = ops.topk(ops.asarray(x[:1]), k)
            order = np.lexsort((np.arange(n), -x[0]))[:k]
            rows.append({"op": "topk", "case": f"n={n} k={k}", "ok": bool(np.array_equal(gi, order)),
                         "got_head": gi[:5].tolist(), "ref_head": order[:5].tolist()})
    # log-probabilities of chosen tokens (system1): against NumpyOps.logprobs, float64
    from reflex_ipc.backends.numpy_ops import NumpyOps

    for R, V, n in ((4, 1000, None), (6, 151936, 151900), (1, 262144, None)):
        x = (rng.standard_normal((R, V)) * 6).astype(np.float32)
        r_idx = rng.integers(0, R, 9)
        t_idx = rng.integers(0, n or V, 9)
        got = ops.logprobs(ops.asarray(x)[0:R], r_idx, t_idx, n=n)
        ref = NumpyOps().logprobs(x, r_idx, t_idx, n=n)
        err = float(np.abs(got - ref).max())
        rows.append({"op": "logprobs", "case": f"R={R} V={V} n={n}", "ok": bool(err < 1e-5),
                     "max_abs_err": err})
    return rows


def _route_margin(logits, k, gating, bias, groups):
    """Per token, the smallest relative gap at a decision of base.moe_route's selection (the
    k-th against the (k+1)-th expert, the last kept group against the next) in float64: rows
    under ~1e-4 could route differently under float32 rounding of another backend."""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True) if gating == "softmax" else 1 / (1 + np.exp(-z))
    sel = p + (0 if bias is None else np.asarray(bias, np.float64))
    N, E = sel.shape
    out = np.full(N, np.inf)
    if groups is not None and groups[0] > 1:
        G, G_used = groups
        g = -np.sort(-sel.reshape(N, G, E // G), -1)[:, :, :2].sum(-1)
        if G_used < G:
            gs = -np.sort(-g, -1)
            out = np.minimum(out, (gs[:, G_used - 1] - gs[:, G_used]) / np.abs(gs[:, G_used - 1]))
        keep = np.argsort(-g, -1, kind="stable")[:, :G_used]
        hidden = np.ones((N, G), bool)
        np.put_along_axis(hidden, keep, False, -1)
        sel = np.where(np.repeat(hidden, E // G, -1), -np.inf, sel)
    if k < E:
        s = -np.sort(-sel, -1)
        with np.errstate(invalid="ignore"):
            gap = np.where(np.isinf(s[:, k]), np.inf, (s[:, k - 1] - s[:, k]) / np.abs(s[:, k - 1]))
        out = np.minimum(out, gap)
    return out


def _moe_inputs(rng, N, K, E, k, gating, bias, groups, router=None, xs=0.5):
    """x [N, K] (and logits [N, E] when router is None) whose routing has no near-ties; x's
    standard deviation xs."""
    x = (rng.standard_normal((N, K)) * xs).astype(np.float32)
    given = (rng.standard_normal((N, E)) * 2).astype(np.float32)
    for _ in range(200):
        lg = x.astype(np.float64) @ router.T if router is not None else given
        bad = _route_margin(lg, k, gating, bias, groups) < 1e-4
        if not bad.any():
            break
        x[bad] = (rng.standard_normal((int(bad.sum()), K)) * xs).astype(np.float32)
        given[bad] = (rng.standard_normal((int(bad.sum()), E)) * 2).astype(np.float32)
    return x, (None if router is not None else given)


def _moe_width(types):
    """An expert width F (the down projection's columns) that every format's blocks divide,
    not a multiple of 256 where the formats allow (tails of the row loops)."""
    if any(t is not None and TYPES[t][1] == 256 for t in types):
        return 256
    return 200 if all(t in (None, "F32", "F16", "BF16") for t in types) else 224


def check_moe(ops, rng):
    """moe on the device (kernels/moe.cuh) against NumpyOps.moe on the same dequantized weights:
    softmax/sigmoid gating, a selection bias, grouped routing, norm on/off, scale, fused gate_up,
    given logits, expert_scale, gelu; every weight format; k = 1..E; N = 1, 3, 17; the routing's
    ids exactly (ties: lower index first); inside a captured graph replayed twice (same bits)."""
    from reflex_ipc.backends.numpy_ops import NumpyOps

    npo = NumpyOps()
    rows = []
    # (label, E, k, types (gate, up, down), opts); up None = a fused gate_up tensor
    cases = [(f"{t} E=8 k=2", 8, 2, (t, t, t), {}) for t in MM_TYPES]
    cases += [
        ("qwen3moe-like E=128 k=8", 128, 8, ("Q4_K", "Q4_K", "Q6_K"), {}),
        ("dsv3-like sigmoid bias groups(8,4) scale", 128, 8, ("Q8_0", "Q8_0", "Q8_0"),
         dict(gating="sigmoid", bias=True, groups=(8, 4), scale=2.5)),
        ("dsv2-like groups(8,3) no norm scale", 64, 6, ("Q5_K", "Q5_K", "Q4_K"),
         dict(norm=False, scale=16.0, groups=(8, 3))),
        ("sigmoid no norm k=1", 8, 1, ("Q4_0", "Q4_0", "Q8_0"), dict(gating="sigmoid", norm=False)),
        ("k=E", 8, 8, ("F16", "F16", "F16"), {}),
        ("gemma4-like fused gelu logits expert_scale", 8, 2, ("Q8_0", None, "Q8_0"),
         dict(act="gelu", logits=True, escale=True)),
        ("gemma4-like fused E=128 k=8", 128, 8, ("Q4_0", None, "Q6_K"),
         dict(act="gelu", logits=True, escale=True)),
        ("gate/up of two formats", 8, 2, ("Q4_K", "Q8_0", "Q6_K"), {}),
        ("groups of one expert", 8, 3, ("F32", "F32", "F32"), dict(gating="sigmoid", groups=(8, 5))),
    ]
    for label, E, k, (tg, tu, td), o in cases:
        big = E > 8
        F = _moe_width((tg, tu, td))
        K, D = (256, 256) if big else (512, 203)
        spec = {"gate": (tg, E * F * (2 if tu is None else 1), K), "down": (td, E * D, F), "router": ("F32", E, K)}
        if tu is not None:
            spec["up"] = (tu, E * F, K)
        W = _weights(ops, spec, rng)
        ref = {key: v[1].astype(np.float32) for key, v in W.items()}
        gating = o.get("gating", "softmax")
        bias = (rng.integers(0, 3, E) * 1.0).astype(np.float32) if o.get("bias") else None
        escale = rng.uniform(0.5, 2.0, E).astype(np.float32) if o.get("escale") else None
        groups = o.get("groups")
        kw = dict(gating=gating, norm=o.get("norm", True), scale=o.get("scale", 1.0), act=o.get("act", "silu"),
                  groups=groups)
        for N in (1, 3, 17):
            x, lg = _moe_inputs(rng, N, K, E, k, gating, bias, groups,
                                router=None if o.get("logits") else ref["router"].astype(np.float64))
            want = npo.moe(x, ref["router"], ref["gate"], ref.get("up"), ref["down"], k, selection_bias=bias,
                           logits=lg, expert_scale=escale, **kw)
            poison(ops, (N, D), (N * k, F))
            got = ops.moe(ops.asarray(x), W["router"][0], W["gate"][0], W["up"][0] if tu is not None else None,
                          W["down"][0], k, selection_bias=None if bias is None else ops.asarray(bias),
                          logits=None if lg is None else ops.asarray(lg),
                          expert_scale=None if escale is None else ops.asarray(escale), **kw)
            rows.append(row("moe", f"{label} N={N}", ops.to_numpy(got), want, 1e-4))
    rows += _check_moe_route(ops, rng)
    rows += _check_moe_graph(ops, rng, npo)
    return rows



# (label, gate/up format (a pair: gate, up of two formats), down format, E, k, K, F, D, opts);
# every MV format for gate/up and for down, k = 1, 4, 6, 8, 12, E = 8..128, K / F of 768, 2048 and
# 2880 where the format allows, D % 4 != 0 (moe_mvdown's last row block part empty)
MOE_MV_CASES = [
    ("qwen3moe-like E=128 k=8", "Q4_K", "Q6_K", 128, 8, 256, 256, 256, {}),
    ("qwen3-30b-a3b rows E=16 k=8", "Q4_K", "Q6_K", 16, 8, 2048, 768, 2048, {}),
    ("q5_k E=8 k=4 D=770", "Q5_K", "Q5_K", 8, 4, 768, 768, 770, {}),
    ("q6_k/q4_k E=8 k=1 no norm", "Q6_K", "Q4_K", 8, 1, 2048, 768, 2048, dict(norm=False)),
    ("q8_0 K=2880 E=8 k=4", "Q8_0", "Q8_0", 8, 4, 2880, 768, 2880, {}),
    ("q8_0 fused gelu F=2880 k=8 expert_scale", "Q8_0", "Q8_0", 8, 8, 768, 2880, 768,
     dict(fused=True, act="gelu", escale=True)),
    ("llama4-like weight_before k=1", "Q4_K", "Q4_K", 16, 1, 2048, 512, 2048,
     dict(gating="sigmoid", norm=False, weight_before=True)),
    ("dsv2-like sigmoid groups(8,3) k=6", "Q5_K", "Q8_0", 64, 6, 512, 512, 512,
     dict(gating="sigmoid", groups=(8, 3), scale=2.5)),
    ("gate/up of two formats", ("Q4_K", "Q8_0"), "Q6_K", 8, 4, 768, 768, 768, {}),
    ("k=12 of 32: two chunks of moe_mvdown's 8 warps", "Q4_K", "Q6_K", 32, 12, 256, 256, 260, {}),
    ("gpt-oss-like swiglu_oai biases k=4", "Q8_0", "Q8_0", 8, 4, 2880, 768, 2880,
     dict(gating="softmax_weight", norm=False, act="swiglu_oai", biases=True)),
]


def check_moe_mv(ops, rng, cases=None):
    """moe's decode form on matvec.cuh's layout (kernels/moe_mv.cuh: moe_mvglu{c,d,e}_* and
    moe_mvdown_*, CUDA only) against NumpyOps.moe on the same dequantized weights: MOE_MV_CASES
    at N = 1, 2, 3 with moe_mvglu's variants c, d, e in turn (every format x variant), each
    call counted as taking the new kernels (moe_mv_launches: 2, or 1 when gate/up take moe_mm),
    a repeated call giving the same bits, and one case captured in a graph and replayed.
    cases: a subset of MOE_MV_CASES (tests on the numpy oracle)."""
    if not hasattr(ops, "moe_mv_variant"):
        return []
    from reflex_ipc.backends.cuda_ops import MOE_MV_GLU
    from reflex_ipc.backends.numpy_ops import NumpyOps

    npo = NumpyOps()
    rows = []
    saved = ops.matvec, ops.moe_mv_variant, ops.moe_mma_min_n
    try:
        ops.matvec, ops.moe_mma_min_n = True, max(ops.moe_mma_min_n, 4)
        for label, tgu, td, E, k, K, F, D, o in MOE_MV_CASES if cases is None else cases:
            tg, tu = tgu if isinstance(tgu, tuple) else (tgu, tgu)
            fused = o.get("fused", False)
            spec = {"gate": (tg, E * F * (2 if fused else 1), K), "down": (td, E * D, F), "router": ("F32", E, K)}
            if not fused:
                spec["up"] = (tu, E * F, K)
            W = _weights(ops, spec, rng)
            ref = {key: v[1].astype(np.float32) for key, v in W.items()}
            gating, groups = o.get("gating", "softmax"), o.get("groups")
            kw = dict(gating=gating, norm=o.get("norm", True), scale=o.get("scale", 1.0), act=o.get("act", "silu"),
                      groups=groups, weight_before=o.get("weight_before", False))
            escale = rng.uniform(0.5, 2.0, E).astype(np.float32) if o.get("escale") else None
            extra = {}
            if o.get("biases"):
                extra = {"router_bias": rng.standard_normal(E) * 0.5, "gate_bias": rng.standard_normal((E, F)),
                         "up_bias": rng.standard_normal((E, F)), "down_bias": rng.standard_normal((E, D)) * 0.1}
                extra = {n: a.astype(np.float32) for n, a in extra.items()}
            expect = 1 if (tg != tu or kw["act"] == "swiglu_oai") else 2
            for N, v in zip((1, 2, 3), MOE_MV_GLU):
                ops.moe_mv_variant = v
                x, _ = _moe_inputs(rng, N, K, E, k, "softmax" if gating == "softmax_weight" else gating, None,
                                   groups, router=ref["router"].astype(np.float64))
                if extra:  # gpt-oss: the router's logits given (its bias moves the routing's margins)
                    lg = (x.astype(np.float64) @ ref["router"].T.astype(np.float64)).astype(np.float32)
                else:
                    lg = None
                want = npo.moe(x, ref["router"], ref["gate"], ref.get("up"), ref["down"], k, logits=lg,
                               expert_scale=escale, **kw, **extra)
                poison(ops, (N, D), (N * k, F))
                dev = {n: ops.asarray(a) for n, a in extra.items()}

                def call():
                    return ops.to_numpy(ops.moe(ops.asarray(x), W["router"][0], W["gate"][0],
                                                None if fused else W["up"][0], W["down"][0], k,
                                                logits=None if lg is None else ops.asarray(lg),
                                                expert_scale=None if escale is None else ops.asarray(escale),
                                                **kw, **dev))

                before = ops.moe_mv_launches
                got = call()
                took = ops.moe_mv_launches - before
                r = row("moe_mv", f"{label} N={N} glu {v}", got, want, 1e-4)
                r["ok"] = r["ok"] and took == expect
                r["moe_mv_launches"] = took
                rows.append(r)
                rows.append({"op": "moe_mv", "case": f"{label} N={N} glu {v} repeated: same bits",
                             "ok": bool(np.array_equal(call(), got))})
        if hasattr(ops, "capture"):  # the decode shape captured once, replayed with new inputs
            ops.moe_mv_variant = None
            E, k, K, F, D = 16, 8, 2048, 768, 2048
            W = _weights(ops, {"gate": ("Q4_K", E * F, K), "up": ("Q4_K", E * F, K), "down": ("Q6_K", E * D, F),
                               "router": ("F32", E, K)}, rng)
            ref = {key: v[1].astype(np.float32) for key, v in W.items()}
            for N in (1, 3):
                X = ops.empty((N, K))
                before = ops.moe_mv_launches
                graph, out = ops.capture(lambda: ops.moe(X, W["router"][0], W["gate"][0], W["up"][0],
                                                         W["down"][0], k))
                took = ops.moe_mv_launches - before
                for rep in range(2):
                    x = _moe_inputs(rng, N, K, E, k, "softmax", None, None,
                                    router=ref["router"].astype(np.float64))[0]
                    ops.write(X, x)
                    graph.launch()
                    want = npo.moe(x, ref["router"], ref["gate"], ref["up"], ref["down"], k)
                    r = row("moe_mv", f"graph E={E} k={k} N={N} replay {rep}", ops.to_numpy(out), want, 1e-4)
                    r["ok"] = r["ok"] and took == 2
                    rows.append(r)
                graph.close()
    finally:
        ops.matvec, ops.moe_mv_variant, ops.moe_mma_min_n = saved
    return rows

MOE_MMA_FORMATS = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def check_moe_grouped(ops, rng):
    """moe's prefill form on tensor cores (CudaOps.moe_mma: moe_group_i32, mmaglu_moe_*, mma_moe_*,
    moe_wsum_f32) against NumpyOps.moe on the same dequantized weights, within MMA_TOL (x, the
    weights and the gated hidden rows rounded to f16): every tensor-core format at E=8 k=2; the
    Qwen3-30B-A3B and DeepSeek-V2-Lite layouts at reduced widths with N = 32..300; a skewed
    routing (one expert takes most tokens: several row tiles, and experts with no token); a
    fused gate_up with gelu, logits and expert_scale; softmax/sigmoid, groups, norm off; the
    Qwen3-30B-A3B layout at N = 600; routings that give expert groups of exactly 1..70 rows
    (and empty experts). Each call must have taken the grouped path (moe_mma_launches), give
    the same bits when repeated and with REFLEX_MOE_SKIP / REFLEX_MMA_WIDE each way (moe_skip,
    mma_wide: the same sums in the same order), and replay from a captured graph with new inputs."""
    from reflex_ipc.backends.numpy_ops import NumpyOps

    if not getattr(ops, "moe_mma", False):
        return [{"op": "moe_grouped", "case": "skipped: moe_mma off (REFLEX_MOE_MMA=0 or before sm_80)",
                 "ok": True}]
    npo = NumpyOps()
    rows = []
    n_min = ops.moe_mma_min_n
    # (label, E, k, (gate, up, down), F, K, D, Ns, opts); up None = a fused gate_up tensor
    cases = [(f"{t} E=8 k=2", 8, 2, (t, t, t), None, 512, 200, (n_min, 70), {}) for t in MOE_MMA_FORMATS]
    cases += [
        ("qwen3moe-like E=128 k=8", 128, 8, ("Q4_K", "Q4_K", "Q6_K"), 256, 512, 256, (n_min, 100, 300), {}),
        ("dsv2-like E=64 k=6 groups(8,3) no norm scale", 64, 6, ("Q8_0", "Q8_0", "Q8_0"), 224, 256, 264,
         (n_min, 130), dict(norm=False, scale=16.0, groups=(8, 3))),
        ("dsv3-like sigmoid bias groups(8,4) scale", 128, 8, ("Q4_K", "Q4_K", "Q6_K"), 256, 256, 256, (77,),
         dict(gating="sigmoid", bias=True, groups=(8, 4), scale=2.5)),
        ("skewed: expert 3 takes most tokens", 16, 4, ("Q5_K", "Q5_K", "Q4_K"), 256, 256, 264, (n_min, 250),
         dict(logits=True, skew=True)),
        ("fused gate_up gelu logits expert_scale", 16, 2, ("Q4_0", None, "Q6_K"), 256, 512, 256, (n_min, 90),
         dict(act="gelu", logits=True, escale=True)),
        ("qwen3moe-like E=128 k=8", 128, 8, ("Q4_K", "Q4_K", "Q6_K"), 256, 512, 256, (600,), {}),
        ("groups of 1..70 rows", 24, 2, ("Q4_K", "Q4_K", "Q6_K"), 256, 512, 264, (MOE_GROUP_SIZES_N,),
         dict(logits=True, sizes=True)),
        ("groups of 1..70 rows", 24, 2, ("Q5_K", "Q5_K", "Q8_0"), 256, 256, 200, (MOE_GROUP_SIZES_N,),
         dict(logits=True, sizes=True)),
    ]
    for label, E, k, (tg, tu, td), F, K, D, Ns, o in cases:
        F = F or _moe_width((tg, tu, td))
        spec = {"gate": (tg, E * F * (2 if tu is None else 1), K), "down": (td, E * D, F), "router": ("F32", E, K)}
        if tu is not None:
            spec["up"] = (tu, E * F, K)
        W = _weights(ops, spec, rng)
        ref = {key: v[1].astype(np.float32) for key, v in W.items()}
        gating = o.get("gating", "softmax")
        bias = (rng.integers(0, 3, E) * 1.0).astype(np.float32) if o.get("bias") else None
        escale = rng.uniform(0.5, 2.0, E).astype(np.float32) if o.get("escale") else None
        groups = o.get("groups")
        kw = dict(gating=gating, norm=o.get("norm", True), scale=o.get("scale", 1.0), act=o.get("act", "silu"),
                  groups=groups)
        # the gated rows reach the down GEMM as f16 (|h| < 65504): the random K-quant blocks hold
        # weights up to ~10, so their x is smaller (|h| grows as x^2)
        xs = 0.03 if any(t in ("Q4_K", "Q5_K", "Q6_K") for t in (tg, tu)) else 0.5
        for N in Ns:
            x, lg = _moe_inputs(rng, N, K, E, k, gating, bias, groups,
                                router=None if o.get("logits") else ref["router"].astype(np.float64), xs=xs)
            if o.get("sizes"):  # expert e takes exactly MOE_GROUP_SIZES[e] of the N * k pairs
                lg = _moe_sized_logits(rng, N, E, k)
            if o.get("skew"):  # 80% of the tokens rank expert 3 first by a wide margin
                hot = rng.random(N) < 0.8
                for _ in range(200):
                    lg[hot, 3] = lg[hot].max(-1) + 4.0
                    bad = _route_margin(lg, k, gating, bias, groups) < 1e-4
                    if not bad.any():
                        break
                    lg[bad] = (rng.standard_normal((int(bad.sum()), E)) * 2).astype(np.float32)
            want = npo.moe(x, ref["router"], ref["gate"], ref.get("up"), ref["down"], k, selection_bias=bias,
                           logits=lg, expert_scale=escale, **kw)
            args = (W["router"][0], W["gate"][0], W["up"][0] if tu is not None else None, W["down"][0], k)
            dkw = dict(selection_bias=None if bias is None else ops.asarray(bias),
                       logits=None if lg is None else ops.asarray(lg),
                       expert_scale=None if escale is None else ops.asarray(escale), **kw)
            X = ops.asarray(x)
            before = ops.moe_mma_launches
            poison(ops, (N, D), (N * k, D))
            got = ops.to_numpy(ops.moe(X, *args, **dkw))
            took = ops.moe_mma_launches == before + 1
            r = row("moe_grouped", f"{label} N={N}", got, want, MMA_TOL)
            r["ok"] = r["ok"] and took
            if not took:
                r["error"] = "the grouped path was not taken"
            rows.append(r)
            again = ops.to_numpy(ops.moe(X, *args, **dkw))
            rows.append({"op": "moe_grouped", "case": f"{label} N={N} repeated: same bits",
                         "ok": bool(np.array_equal(again, got))})
            rows += _tile_variants(ops, lambda: ops.to_numpy(ops.moe(X, *args, **dkw)), got, f"{label} N={N}")
    rows += _check_moe_grouped_graph(ops, rng, npo)
    rows += _check_moe_grouped_archs(ops, rng, npo)
    return rows


# expert group sizes (pairs an expert takes) of check_moe_grouped's "groups of 1..70 rows":
# one, a few, one short of / at / one past each 8- and 16-token warp tile, half and whole 64-row
# tiles, two tiles; 5 of its 24 experts take none
MOE_GROUP_SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 70)
MOE_GROUP_SIZES_N = sum(MOE_GROUP_SIZES) // 2  # tokens at k = 2


def _moe_sized_logits(rng, N, E, k):
    """Logits [N, E] whose top k (softmax, by wide margins) give expert e exactly
    MOE_GROUP_SIZES[e] pairs (0 past them), each token's k experts distinct."""
    lab = np.repeat(np.arange(len(MOE_GROUP_SIZES)), MOE_GROUP_SIZES)
    assert lab.size == N * k and max(MOE_GROUP_SIZES) <= N
    lab = lab.reshape(k, N)  # sorted: token n's slots lab[j, n] are distinct (no group exceeds N)
    perm = rng.permutation(N)
    lg = (rng.standard_normal((N, E)) * 0.5).astype(np.float32)
    for j in range(k):
        lg[perm, lab[j]] = 12.0 - 2.0 * j
    return lg


def _tile_variants(ops, run, got, name, op="moe_grouped", switches=("moe_skip", "mma_wide")):
    """The same call with each of CudaOps' switches (moe_skip: REFLEX_MOE_SKIP, mma_wide:
    REFLEX_MMA_WIDE) flipped alone and all together: the same bits as got."""
    switches = [a for a in switches if hasattr(ops, a)]
    rows = []
    saved = {a: getattr(ops, a) for a in switches}
    sets = [(a,) for a in switches] + ([tuple(switches)] if len(switches) > 1 else [])
    try:
        for flip in sets:
            for a in switches:
                setattr(ops, a, saved[a] != (a in flip))
            what = " ".join(f"{a}={int(getattr(ops, a))}" for a in flip)
            rows.append({"op": op, "case": f"{name} {what}: same bits", "ok": bool(np.array_equal(run(), got))})
    finally:
        for a, v in saved.items():
            setattr(ops, a, v)
    return rows


def _check_moe_grouped_archs(ops, rng, npo):
    """The grouped prefill in gpt-oss's form (router bias, softmax_weight, expert gate/up biases
    and the clamped SwiGLU in mmaglu_moe's epilogue: act 2, down biases after the weighted sum;
    F16 and Q8_0 experts) and Llama 4's (sigmoid, each pair's input
    weighted first: x rows per pair, unit weights; k = 1 and 2), against NumpyOps.moe within
    MMA_TOL; each call must take the grouped path and repeat its bits; one captured graph."""
    rows = []
    n_min = ops.moe_mma_min_n
    E, K, D = 32, 256, 264
    oai = dict(gating="softmax_weight", norm=False, act="swiglu_oai")
    l4 = dict(gating="sigmoid", norm=False, weight_before=True)
    for label, k, fmt, kw in (("gpt-oss-like", 4, ("F16", "F16", "F16"), oai),
                              ("gpt-oss-like", 4, ("Q8_0", "Q8_0", "Q8_0"), oai),
                              ("llama4-like k=1", 1, ("Q4_K", "Q4_K", "Q6_K"), l4),
                              ("llama4-like k=2", 2, ("F16", "F16", "F16"), l4)):
        F = _moe_width(fmt)
        W = _weights(ops, {"gate": (fmt[0], E * F, K), "up": (fmt[1], E * F, K), "down": (fmt[2], E * D, F),
                           "router": ("F32", E, K)}, rng)
        ref = {key: v[1].astype(np.float32) for key, v in W.items()}
        # gate products of std ~4: the clamp at 7 bites, f16 rounding of x stays far below MMA_TOL
        xs = 4.0 / (float(np.sqrt(np.mean(ref["gate"].astype(np.float64) ** 2))) * np.sqrt(K))
        if kw is l4:  # the silu unit: |h| ~ g * u stays small
            xs = 0.03 if fmt[0].endswith("_K") else 0.5
        extra_np = {}
        if kw is oai:
            extra_np = {"router_bias": rng.standard_normal(E) * 0.5, "gate_bias": rng.standard_normal((E, F)) * 2,
                        "up_bias": rng.standard_normal((E, F)) * 2, "down_bias": rng.standard_normal((E, D)) * 0.5}
            extra_np = {n: a.astype(np.float32) for n, a in extra_np.items()}
        extra = {n: ops.asarray(a) for n, a in extra_np.items()}
        name = f"{label} {'/'.join(fmt)} E={E} k={k}"
        for N in (n_min, 150):
            x, lg = _moe_inputs(rng, N, K, E, k, "sigmoid" if kw is l4 else "softmax", None, None, xs=xs)
            lg = (lg - extra_np.get("router_bias", np.float32(0))).astype(np.float32)  # + router bias: lg as drawn
            want = npo.moe(x, ref["router"], ref["gate"], ref["up"], ref["down"], k, logits=lg, **kw, **extra_np)
            X, LG = ops.asarray(x), ops.asarray(lg)
            args = (W["router"][0], W["gate"][0], W["up"][0], W["down"][0], k)
            before = ops.moe_mma_launches
            poison(ops, (N, D), (N * k, D))
            got = ops.to_numpy(ops.moe(X, *args, logits=LG, **kw, **extra))
            took = ops.moe_mma_launches == before + 1
            r = row("moe_grouped", f"{name} N={N}", got, want, MMA_TOL)
            r["ok"] = r["ok"] and took
            if not took:
                r["error"] = "the grouped path was not taken"
            rows.append(r)
            again = ops.to_numpy(ops.moe(X, *args, logits=LG, **kw, **extra))
            rows.append({"op": "moe_grouped", "case": f"{name} N={N} repeated: same bits",
                         "ok": bool(np.array_equal(again, got))})
            rows += _tile_variants(ops, lambda: ops.to_numpy(ops.moe(X, *args, logits=LG, **kw, **extra)), got,
                                   f"{name} N={N}")
        if hasattr(ops, "capture") and fmt[0] == "Q8_0" and 48 >= n_min:
            N = 48
            X, LG = ops.empty((N, K)), ops.empty((N, E))
            graph, out = ops.capture(lambda: ops.moe(X, *args, logits=LG, **kw, **extra))
            try:
                for rep in range(2):
                    x, lg = _moe_inputs(rng, N, K, E, k, "softmax", None, None, xs=xs)
                    lg = (lg - extra_np["router_bias"]).astype(np.float32)
                    ops.write(X, x)
                    ops.write(LG, lg)
                    graph.launch()
                    want = npo.moe(x, ref["router"], ref["gate"], ref["up"], ref["down"], k, logits=lg, **kw,
                                   **extra_np)
                    rows.append(row("moe_grouped", f"{name} graph N={N} replay {rep}", ops.to_numpy(out), want,
                                    MMA_TOL))
            finally:
                graph.close()
    return rows


def _check_moe_grouped_graph(ops, rng, npo):
    """The grouped moe captured once (a 48-token ForwardGraphs bucket's size) and replayed with
    new inputs: each replay equals numpy; the same inputs again give the same bits."""
    if not hasattr(ops, "capture"):
        return []
    E, k, K, F, D, N = 32, 4, 512, 256, 264, 48
    if N < ops.moe_mma_min_n:
        return []
    W = _weights(ops, {"gate": ("Q4_K", E * F, K), "up": ("Q4_K", E * F, K), "down": ("Q6_K", E * D, F),
                       "router": ("F32", E, K)}, rng)
    ref = {key: v[1].astype(np.float32) for key, v in W.items()}
    rows = []
    X = ops.empty((N, K))
    graph, out = ops.capture(lambda: ops.moe(X, W["router"][0], W["gate"][0], W["up"][0], W["down"][0], k))
    got = []
    for rep in range(2):
        x = _moe_inputs(rng, N, K, E, k, "softmax", None, None, router=ref["router"].astype(np.float64),
                        xs=0.03)[0]
        ops.write(X, x)
        graph.launch()
        got.append(ops.to_numpy(out).copy())
        want = npo.moe(x, ref["router"], ref["gate"], ref["up"], ref["down"], k)
        rows.append(row("moe_grouped", f"graph N={N} replay {rep}", got[-1], want, MMA_TOL))
    ops.write(X, x)
    graph.launch()
    rows.append({"op": "moe_grouped", "case": f"graph N={N} replay again: same bits",
                 "ok": bool(np.array_equal(ops.to_numpy(out), got[-1]))})
    graph.close()
    return rows


def _check_moe_route(ops, rng):
    """ops.moe_route's ids exactly equal base.moe_route's (best first, lower index first on
    ties), weights within float32 rounding; exact ties from logits on a coarse grid."""
    from reflex_ipc.backends.base import moe_route

    rows = []
    if not hasattr(ops, "moe_route"):
        return rows
    cases = [  # E, k, gating, bias, groups, norm, scale, ties
        (8, 2, "softmax", False, None, True, 1.0, False), (128, 8, "softmax", False, None, True, 1.0, False),
        (128, 8, "sigmoid", True, (8, 4), True, 2.5, False), (64, 6, "softmax", False, (8, 3), False, 16.0, False),
        (8, 8, "sigmoid", False, None, False, 1.0, False), (256, 8, "sigmoid", True, (8, 4), True, 2.5, False),
        (8, 2, "softmax", False, None, True, 1.0, True), (128, 8, "softmax", False, None, True, 1.0, True),
        (128, 8, "sigmoid", False, (8, 4), True, 1.0, True), (64, 6, "softmax", False, (16, 3), False, 1.0, True),
        (32, 1, "sigmoid", False, None, False, 1.0, True),
        # moe_route_warp_f32's edges (CUDA; up to 256 experts without groups): lanes of 8 experts
        # and of none, past 256 experts the block kernel again, gpt-oss's softmax_weight
        (256, 8, "softmax", False, None, True, 1.0, False), (200, 8, "sigmoid", True, None, True, 2.5, False),
        (256, 8, "sigmoid", False, None, True, 1.0, True), (20, 16, "softmax", False, None, True, 1.0, True),
        (300, 8, "softmax", False, None, True, 1.0, False), (32, 4, "softmax_weight", False, None, False, 1.0, True),
    ]
    warp0 = getattr(ops, "moe_route_warp", None)
    try:
        for warp in ((True, False) if warp0 is not None else (None,)):
            if warp is not None:
                ops.moe_route_warp = warp
            for case in cases:
                rows += _moe_route_rows(ops, rng, case, "" if warp is None else f" warp={warp}")
    finally:
        if warp0 is not None:
            ops.moe_route_warp = warp0
    return rows


def _moe_route_rows(ops, rng, case, tag):
    from reflex_ipc.backends.base import moe_route

    rows = []
    E, k, gating, has_bias, groups, norm, scale, ties = case
    for N in (1, 17):
        bias = (rng.integers(0, 3, E) * 1.0).astype(np.float32) if has_bias else None
        if ties:  # exact ties: every implementation computes equal values for equal logits
            lg = (rng.integers(0, 4, (N, E)) * 0.5).astype(np.float32)
        else:
            lg = _moe_inputs(rng, N, 8, E, k, gating, bias, groups)[1]
        top, w = moe_route(lg, k, gating, norm, scale, bias, groups)
        ids, wts = ops.moe_route(ops.asarray(lg), k, gating=gating, norm=norm, scale=scale,
                                 selection_bias=None if bias is None else ops.asarray(bias), groups=groups)
        got = ops.to_numpy(ids)
        name = (f"E={E} k={k} {gating} bias={has_bias} groups={groups} norm={norm} scale={scale} ties={ties} "
                f"N={N}{tag}")
        rows.append({"op": "moe_route", "case": name + " ids", "ok": bool(np.array_equal(got, top)),
                     "got": got[:2].tolist(), "ref": top[:2].tolist()})
        rows.append(row("moe_route", name + " weights", ops.to_numpy(wts), w, 1e-6))
    return rows


def _check_moe_graph(ops, rng, npo):
    """The device moe captured once and replayed with new inputs: each replay equals numpy, and
    a replay of the same inputs gives the same bits."""
    if not hasattr(ops, "capture"):
        return []
    E, k, K, F, D = 16, 4, 512, 256, 203
    W = _weights(ops, {"gate": ("Q4_K", E * F, K), "up": ("Q4_K", E * F, K), "down": ("Q6_K", E * D, F),
                       "router": ("F32", E, K)}, rng)
    ref = {key: v[1].astype(np.float32) for key, v in W.items()}
    rows = []
    for N in (1, 5):
        X = ops.empty((N, K))
        graph, out = ops.capture(lambda: ops.moe(X, W["router"][0], W["gate"][0], W["up"][0], W["down"][0], k))
        got = []
        for rep in range(2):
            x = _moe_inputs(rng, N, K, E, k, "softmax", None, None, router=ref["router"].astype(np.float64))[0]
            ops.write(X, x)
            graph.launch()
            got.append(ops.to_numpy(out).copy())
            want = npo.moe(x, ref["router"], ref["gate"], ref["up"], ref["down"], k)
            rows.append(row("moe", f"graph N={N} replay {rep}", got[-1], want, 1e-4))
        ops.write(X, x)
        graph.launch()
        rows.append({"op": "moe", "case": f"graph N={N} replay again: same bits",
                     "ok": bool(np.array_equal(ops.to_numpy(out), got[-1]))})
        graph.close()
    return rows


MV_CHECK_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0")


def check_matvec(ops, rng):
    """kernels/matvec.cuh (CUDA only; run whatever REFLEX_MATVEC says): every variant of the
    one-token matvec, q/k/v (matmul_n), gated unit and their RMSNorm-folded forms, for each
    format it serves, on widths of an odd number of blocks and rows that leave a block
    partly empty (3 rows: fewer than a block of the 4-row variant), with rows at 2-byte
    offsets (Q6_K / Q8_0 rows of 2 mod 4 bytes); against float64 and against the
    matmul.cuh / fused.cuh kernels (REFLEX_MATVEC=old)."""
    from reflex_ipc.backends.base import rms_norm_matmul_glu, rms_norm_matmul_n

    if not hasattr(ops, "matvec"):
        return []
    from reflex_ipc.backends.cuda_ops import MV_VARIANTS

    rows = []
    saved = ops.matvec, ops.mv_variant
    try:
        for name in MV_CHECK_TYPES:
            for K in ((768, 1280) if name.endswith("_K") else (96, 1056)):
                Ms = (201, 70, 3)
                W = _weights(ops, {"w0": (name, Ms[0], K), "w1": (name, Ms[1], K), "w2": (name, Ms[2], K),
                                   "up": (name, Ms[0], K)}, rng)
                ws = [W[f"w{i}"][0] for i in range(3)]
                (wg, rg), (wu, ru) = W["w0"], W["up"]
                x = rng.standard_normal((1, K)) + 0.15
                x = (x * 2 / np.std(x @ rg.T)).astype(np.float32)  # gate values of a few units
                x64 = x.astype(np.float64)
                nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
                nw = (nw * 2 / np.std(_rms64(x, nw, 1e-6) @ rg.T)).astype(np.float32)
                X, NW = ops.asarray(x), ops.asarray(nw)
                y0 = rng.standard_normal((1, Ms[2])).astype(np.float32)
                h = _rms64(x, nw, 1e-6)
                h0 = _rms64(x, None, 1e-6)

                def run():
                    out = {}
                    poison(ops, *[(1, m) for m in Ms])
                    out["mm"] = ops.to_numpy(ops.matmul(X, ws[0]))
                    Y = ops.asarray(y0.copy())
                    ops.matmul(X, ws[2], out=Y, accumulate=True)
                    out["acc"] = ops.to_numpy(Y)
                    out["n"] = [ops.to_numpy(o) for o in ops.matmul_n(X, ws)]
                    out["norm_n"] = [ops.to_numpy(o) for o in rms_norm_matmul_n(ops, X, NW, 1e-6, ws)]
                    out["norm_n0"] = [ops.to_numpy(o) for o in rms_norm_matmul_n(ops, X, None, 1e-6, ws[1:])]
                    out["glu"] = ops.to_numpy(ops.matmul_glu(X, wg, wu, act="silu"))
                    out["norm_glu"] = ops.to_numpy(rms_norm_matmul_glu(ops, X, NW, 1e-6, wg, wu, act="gelu"))
                    return out

                def silu(g):
                    return g / (1 + np.exp(-g))

                def gelu(g):
                    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))

                refs = {"mm": x64 @ W["w0"][1].T, "acc": y0 + x64 @ W["w2"][1].T,
                        "n": [x64 @ W[f"w{i}"][1].T for i in range(3)],
                        "norm_n": [h @ W[f"w{i}"][1].T for i in range(3)],
                        "norm_n0": [h0 @ W[f"w{i}"][1].T for i in (1, 2)],
                        "glu": silu(x64 @ rg.T) * (x64 @ ru.T), "norm_glu": gelu(h @ rg.T) * (h @ ru.T)}
                ops.matvec = False
                old = run()
                ops.matvec = True
                if hasattr(ops, "_mv_ok"):  # the weights really take matvec.cuh (alignment)
                    taken = ops._mv_ok(X, ws + [wu])
                    rows.append({"op": "matvec", "case": f"{name} K={K} takes matvec.cuh", "rel_err": 0.0 if taken
                                 else float("inf"), "max_abs": 0.0, "tol": 0.0, "ok": bool(taken)})
                for v in MV_VARIANTS:
                    ops.mv_variant = v
                    new = run()
                    for key, ref in refs.items():
                        outs, olds, rs = ((new[key], old[key], ref) if not isinstance(ref, list)
                                          else (np.concatenate(new[key], -1), np.concatenate(old[key], -1),
                                                np.concatenate(ref, -1)))
                        case = f"{name} K={K} {key} variant {v}"
                        rows.append(row("matvec", case, outs, rs, MM_TOL))
                        rows.append(row("matvec", case + " vs old kernels", outs, olds, 5e-6))
    finally:
        ops.matvec, ops.mv_variant = saved
    return rows


def bench_matvec(ops, rng):
    """GB/s of decode-shaped matvecs (N=1) by type and shape (8 rotating weight copies so
    that L2 holds less of them)."""
    out = []
    configs = [("Q8_0", 4096, 4096), ("Q8_0", 1024, 1024), ("Q8_0", 3072, 1024), ("Q8_0", 1024, 3072),
               ("Q4_0", 4096, 4096), ("Q4_K", 4096, 4096), ("Q6_K", 4096, 4096), ("F16", 4096, 4096)]
    for name, M, K in configs:
        tensors = {}
        for c in range(8):
            raw, _ = random_weight(name, M, K, rng) if c == 0 else (tensors["w0"][0], None)
            tensors[f"w{c}"] = (raw, TYPES[name][0], (M, K))
        f = weights_gguf(tensors)
        ws = [ops.load_weight(f, f"w{c}") for c in range(8)]
        x = ops.asarray(rng.standard_normal((1, K)).astype(np.float32))
        y = ops.empty((1, M))
        for w in ws:
            ops.matmul(x, w, out=y)
        ops.synchronize()
        ms = _event_ms(ops, lambda r: ops.matmul(x, ws[r % 8], out=y), 200)
        nbytes = len(tensors["w0"][0])
        out.append({"type": name, "M": M, "K": K, "us": round(ms * 1e3, 2),
                    "GB_per_s": round(nbytes / (ms / 1e3) / 1e9, 1)})
    # host-side cost of one launch (pack + cuLaunchKernel), small kernel back to back
    a = ops.asarray(np.ones(256, np.float32))
    ops.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        ops.scale(a, 1.0, out=a)
    t1 = time.perf_counter()
    ops.synchronize()
    t2 = time.perf_counter()
    out.append({"launch_host_us": round((t1 - t0) / 2000 * 1e6, 2),
                "launch_total_us": round((t2 - t0) / 2000 * 1e6, 2)})
    return out


# matvecs of a few tokens (2 <= N < MMA_MIN_N) timed by bench_matvec_nt: (label, op, type, the
# weights' rows, K) for one layer of a Qwen3-0.6B-shaped model (hidden 1024, q 2048, k/v 1024,
# FFN 3072; a Q8_0 and a Q4_K-mix file) and of a 2B-shaped one (hidden 2048, FFN 6144)
MMNT_BENCH = (("0.6B qkv", "n", "Q8_0", (2048, 1024, 1024), 1024), ("0.6B o", "mm", "Q8_0", (1024,), 2048),
              ("0.6B gate/up", "glu", "Q8_0", (3072, 3072), 1024), ("0.6B down", "mm", "Q8_0", (1024,), 3072),
              ("0.6B qkv", "n", "Q4_K", (2048, 1024, 1024), 1024), ("0.6B gate/up", "glu", "Q4_K", (3072, 3072), 1024),
              ("0.6B down", "mm", "Q6_K", (1024,), 3072),
              ("2B 6144x2048", "mm", "Q6_K", (6144,), 2048), ("2B gate/up", "glu", "Q4_K", (6144, 6144), 2048),
              ("2B qkv", "n", "Q4_K", (2048, 512, 512), 2048), ("2B down", "mm", "Q4_K", (2048,), 6144))
MMNT_BENCH_N = (2, 6, 16, 32)


def bench_matvec_nt(ops, rng, configs=MMNT_BENCH, Ns=MMNT_BENCH_N, reps=30):
    """us and GB/s (the weights' bytes over the time) of the multi-token matvecs, the
    warp-per-row mm4 / mm8 kernels ("old", ops.mmnt off) against matvec_nt.cuh's ("new"),
    timed with CUDA events over `reps` calls that rotate over copies of the weights (at
    least ~96 MB in all, so that L2 holds little of them, as in a forward pass)."""
    out = []
    mmnt0 = ops.mmnt
    try:
        for label, op, name, Ms, K in configs:
            raws = [random_weight(name, M, K, rng, ref=False)[0] for M in Ms]
            nbytes = sum(len(r) for r in raws)
            copies = max(2, min(24, -(-96 * 2 ** 20 // nbytes)))
            tensors = {f"w{c}.{i}": (raw, TYPES[name][0], (M, K)) for c in range(copies)
                       for i, (raw, M) in enumerate(zip(raws, Ms))}
            f = weights_gguf(tensors)
            sets = [[ops.load_weight(f, f"w{c}.{i}") for i in range(len(Ms))] for c in range(copies)]
            for N in Ns:
                x = ops.asarray(rng.standard_normal((N, K)).astype(np.float32))
                y = ops.empty((N, Ms[0]))
                if op == "mm":
                    fn = lambda ws: ops.matmul(x, ws[0], out=y)  # noqa: E731
                elif op == "n":
                    fn = lambda ws: ops.matmul_n(x, ws)  # noqa: E731
                else:
                    fn = lambda ws: ops.matmul_glu(x, ws[0], ws[1])  # noqa: E731
                res = {"case": f"{label} {name}", "N": N, "MB": round(nbytes / 1e6, 2)}
                for tag, mode in (("old", False), ("new", True)):
                    ops.mmnt = mode
                    for ws in sets:
                        fn(ws)
                    ops.synchronize()
                    ms = _event_ms(ops, lambda r: fn(sets[r % copies]), reps)
                    res[f"{tag}_us"] = round(ms * 1e3, 1)
                    res[f"{tag}_GBps"] = round(nbytes / (ms / 1e3) / 1e9)
                res["speedup"] = round(res["old_us"] / res["new_us"], 2)
                out.append(res)
    finally:
        ops.mmnt = mmnt0
    return out


MOE_BENCH = {  # layer shapes: (E, k, K, F, gate/up type, down type)
    "qwen3-30b-a3b": (128, 8, 2048, 768, "Q4_K", "Q6_K"),
    "deepseek-v2-lite": (64, 6, 2048, 1408, "Q8_0", "Q8_0"),
}
MOE_BENCH_N = (8, 16, 32, 64, 128, 512)


def bench_moe(ops, rng, shapes=("qwen3-30b-a3b",), Ns=MOE_BENCH_N):
    """Microseconds per call of one MoE layer of each shape (MOE_BENCH; F32 router): the device
    path eager and captured at N = 1 (decode), the host-routed path (REFLEX_CUDA_MOE=host) at
    N = 1, and at each N of Ns the grouped tensor-core form (`grouped_N*`, when the backend has
    it) against one matvec per pair (`pairs_N*`): where the crossover (moe_mma_min_n) lies."""
    out = {}
    for shape in shapes:
        E, k, K, F, tgu, td = MOE_BENCH[shape]
        spec = {"router": ("F32", E, K), "gate": (tgu, E * F, K), "up": (tgu, E * F, K), "down": (td, E * K, F)}
        tensors = {key: (random_weight(t, r, c, rng, ref=False)[0], TYPES[t][0], (r, c))
                   for key, (t, r, c) in spec.items()}
        f = weights_gguf(tensors)
        W = {key: ops.load_weight(f, key) for key in spec}
        res = out[shape] = {}

        def timed(fn, reps):
            fn()
            ops.synchronize()
            t0 = time.perf_counter()
            ms = _event_ms(ops, lambda r: fn(), reps)
            return round(ms * 1e3, 1), round((time.perf_counter() - t0) * 1e6 / reps, 1)

        def moe(X):
            return ops.moe(X, W["router"], W["gate"], W["up"], W["down"], k)

        X = ops.asarray(rng.standard_normal((1, K)).astype(np.float32) * 0.5)
        res["device_N1_us"] = timed(lambda: moe(X), 200)[0]
        graph, _ = ops.capture(lambda: moe(X))
        res["device_N1_graph_us"] = timed(graph.launch, 200)[0]
        graph.close()
        if hasattr(ops, "moe_mv_launches"):  # moe.cuh's generic per-pair kernels (matvec off) for A/B
            mv0 = ops.matvec
            try:
                ref = ops.to_numpy(moe(X))
                ops.matvec = False
                res["generic_rel_err"] = float(rel_err(ops.to_numpy(moe(X)), ref)[0])
                graph, _ = ops.capture(lambda: moe(X))
                res["device_N1_graph_generic_us"] = timed(graph.launch, 200)[0]
                graph.close()
            finally:
                ops.matvec = mv0
        if hasattr(ops, "moe_down_split"):  # the down projection a warp per (pair, row): same bits?
            split0 = ops.moe_down_split
            try:
                ref = ops.to_numpy(moe(X))
                ops.moe_down_split = True
                res["down_split_same_bits"] = bool(np.array_equal(ops.to_numpy(moe(X)), ref))
                graph, _ = ops.capture(lambda: moe(X))
                res["device_N1_graph_split_us"] = timed(graph.launch, 200)[0]
                graph.close()
            finally:
                ops.moe_down_split = split0
        prev, ops._moe_host_mode = ops._moe_host_mode, True
        try:
            res["host_routed_N1_wall_us"] = timed(lambda: moe(X), 50)[1]
        finally:
            ops._moe_host_mode = prev
        mma0, min0 = getattr(ops, "moe_mma", False), getattr(ops, "moe_mma_min_n", 0)
        try:
            for N in Ns:
                X = ops.asarray(rng.standard_normal((N, K)).astype(np.float32) * 0.5)
                ops.moe_mma = False
                res[f"pairs_N{N}_us"] = timed(lambda: moe(X), 3 if N >= 256 else 10)[0]
                if mma0:
                    ops.moe_mma, ops.moe_mma_min_n = True, 1
                    res[f"grouped_N{N}_us"] = timed(lambda: moe(X), 10)[0]
        finally:
            ops.moe_mma, ops.moe_mma_min_n = mma0, min0
        print(f"[bench] moe {shape}: " + ", ".join(f"{a}={b}" for a, b in res.items()), flush=True)
    return out


MOE_TILE_VARIANTS = ((True, True), (False, False), (True, False), (False, True))  # (moe_skip, mma_wide)
MOE_TILE_DENSE = (("Q4_K", 4096, 2048), ("Q6_K", 2048, 4096))  # (type, M, K): Qwen3-30B-A3B's q and o


def bench_moe_tile(ops, rng, shapes=("qwen3-30b-a3b", "deepseek-v2-lite"), N=512, rounds=3, reps=10,
                   table=MOE_BENCH, dense=MOE_TILE_DENSE):
    """The grouped MoE GEMMs (one MoE layer of each MOE_BENCH shape at N tokens, the prefill
    form) and two dense tensor-core matmuls of the Qwen3-30B-A3B shape (Q4_K 2048 -> 4096, Q6_K
    4096 -> 2048, N tokens) under each (moe_skip, mma_wide) of MOE_TILE_VARIANTS (REFLEX_MOE_SKIP,
    REFLEX_MMA_WIDE): GPU us per call (CUDA events, `reps` calls), the variants alternated for
    `rounds` rounds and the median kept; `same_bits`: every variant's output equals the first's;
    `*_wide_launches`: the call's launches that took DeqWide (0 when the weights' format or
    alignment does not allow it). Rows {case, variant: us, ..., same_bits, speedup (plain
    over skip+wide)}."""
    out = []
    saved = {a: getattr(ops, a) for a in ("moe_skip", "mma_wide", "moe_mma", "moe_mma_min_n")}
    tag = lambda v: f"skip{int(v[0])}_wide{int(v[1])}"  # noqa: E731
    try:
        ops.moe_mma, ops.moe_mma_min_n = True, 1
        cases = []
        for shape in shapes:
            E, k, K, F, tgu, td = table[shape]
            spec = {"router": ("F32", E, K), "gate": (tgu, E * F, K), "up": (tgu, E * F, K), "down": (td, E * K, F)}
            tensors = {key: (random_weight(t, r, c, rng, ref=False)[0], TYPES[t][0], (r, c))
                       for key, (t, r, c) in spec.items()}
            W = {key: ops.load_weight(weights_gguf(tensors), key) for key in spec}
            X = ops.asarray(rng.standard_normal((N, K)).astype(np.float32) * 0.5)
            cases.append((f"moe {shape} N={N}", lambda W=W, X=X, k=k: ops.moe(X, W["router"], W["gate"], W["up"],
                                                                               W["down"], k)))
        for t, M, K in dense:
            tensors = {"w": (random_weight(t, M, K, rng, ref=False)[0], TYPES[t][0], (M, K))}
            w = ops.load_weight(weights_gguf(tensors), "w")
            X = ops.asarray(rng.standard_normal((N, K)).astype(np.float32) * 0.5)
            cases.append((f"matmul {t} {K}->{M} N={N}", lambda w=w, X=X: ops.matmul(X, w)))
        for name, fn in cases:
            res, times, first = {"case": name}, {}, None
            same = True
            for rnd in range(rounds):
                for v in MOE_TILE_VARIANTS:
                    ops.moe_skip, ops.mma_wide = v
                    w0 = getattr(ops, "wide_launches", 0)
                    y = ops.to_numpy(fn())  # warm, and the bits
                    res[f"{tag(v)}_wide_launches"] = getattr(ops, "wide_launches", 0) - w0
                    if first is None:
                        first = y
                    same = same and bool(np.array_equal(y, first))
                    ops.synchronize()
                    times.setdefault(tag(v), []).append(_event_ms(ops, lambda r: fn(), reps) * 1e3)
            for key, ts in times.items():
                res[f"{key}_us"] = round(sorted(ts)[len(ts) // 2], 1)
            res["same_bits"] = same
            res["speedup"] = round(res["skip0_wide0_us"] / res["skip1_wide1_us"], 3)
            print(f"[bench] moe_tile {json.dumps(res)}", flush=True)
            out.append(res)
    finally:
        for a, v in saved.items():
            setattr(ops, a, v)
    return out


def _recurrent_specs(rng):
    """{op: (per-token inputs for T tokens: T -> {name: numpy}, constants {name: numpy}, state shape
    without the sequence axis, call(ops, inputs, constants, state, seqs) -> output)} of the
    recurrent ops at odd sizes and one realistic size each."""
    F = np.float32

    def l2(a):
        return (a / np.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)).astype(F)

    specs = {}
    for C, K in ((37, 4), (1024, 4)):
        specs[f"ssm_conv C={C} K={K}"] = (
            lambda T, C=C: {"x": rng.standard_normal((T, C)).astype(F)},
            {"w": rng.standard_normal((C, K)).astype(F) * 0.5}, (K - 1, C),
            lambda o, i, c, st, seqs: o.ssm_conv(i["x"], st, c["w"], seqs))
    for Hk, Hv, D in ((1, 3, 37), (2, 6, 128)):
        specs[f"delta_net Hk={Hk} Hv={Hv} D={D}"] = (
            lambda T, Hk=Hk, Hv=Hv, D=D: {
                "q": l2(rng.standard_normal((T, Hk, D))), "k": l2(rng.standard_normal((T, Hk, D))),
                "v": rng.standard_normal((T, Hv, D)).astype(F),
                "g": -np.abs(rng.standard_normal((T, Hv)) * 0.3).astype(F),
                "beta": rng.uniform(0.05, 0.95, (T, Hv)).astype(F)},
            {}, (Hv, D, D),
            lambda o, i, c, st, seqs, D=D: o.delta_net(i["q"], i["k"], i["v"], i["g"], i["beta"], st, seqs,
                                                       scale=1.0 / np.sqrt(D)))
    for H, P, G, Ns in ((6, 5, 2, 19), (16, 64, 2, 128)):
        specs[f"ssm_scan H={H} P={P} G={G} Ns={Ns}"] = (
            lambda T, H=H, P=P, G=G, Ns=Ns: {
                "x": rng.standard_normal((T, H, P)).astype(F),
                "dt": rng.uniform(0.01, 1.0, (T, H)).astype(F),
                "B": rng.standard_normal((T, G, Ns)).astype(F), "C": rng.standard_normal((T, G, Ns)).astype(F)},
            {"A": -rng.uniform(0.3, 3.0, H).astype(F), "D": rng.standard_normal(H).astype(F)}, (H, P, Ns),
            lambda o, i, c, st, seqs: o.ssm_scan(i["x"], i["dt"], c["A"], i["B"], i["C"], st, seqs, D=c["D"]))
    return specs


def check_recurrent(ops, rng):
    """sigmoid, softplus, columns, ssm_conv, delta_net, ssm_scan against the numpy backend: one
    token and 37 tokens of one sequence, 37 tokens of 3 interleaved sequences (system1's forked
    candidates), the state carried across two calls, and the one-token step captured in a
    graph and replayed twice with new inputs written before each launch."""
    from reflex_ipc.backends.numpy_ops import NumpyOps

    if not callable(getattr(ops, "delta_net", None)):
        return [{"op": "recurrent", "case": "missing", "ok": False, "error": "no recurrent ops"}]
    ref_ops = NumpyOps()
    rows = []
    a = (rng.standard_normal((5, 301)) * 8).astype(np.float32)
    a[0, :4] = [-30.0, 19.9, 20.5, 60.0]
    a64 = a.astype(np.float64)
    A = ops.asarray(a)
    rows.append(row("sigmoid", "", ops.to_numpy(ops.sigmoid(A)), 1 / (1 + np.exp(-a64)), 1e-6))
    rows.append(row("softplus", "", ops.to_numpy(ops.softplus(A)),
                    np.where(a64 > 20, a64, np.log1p(np.exp(np.minimum(a64, 20)))), 1e-6))
    gate = rng.standard_normal((5, 1)).astype(np.float32)
    rows.append(row("mul", "per-row gate [N, 1]", ops.to_numpy(ops.mul(A, ops.asarray(gate))), a64 * gate, 1e-7))
    x3 = rng.standard_normal((3, 7, 29)).astype(np.float32)
    for start, n in ((0, 29), (3, 11), (28, 1)):
        rows.append(row("columns", f"{start}:{start + n} of 29", ops.to_numpy(ops.columns(ops.asarray(x3), start, n)),
                        x3[..., start:start + n], 0.0))
    n_seq = 4
    for name, (make, consts, sshape, call) in _recurrent_specs(rng).items():
        op = name.split()[0]
        dconsts = {k: ops.asarray(v) for k, v in consts.items()}
        state0 = (rng.standard_normal((n_seq,) + sshape) * 0.3).astype(np.float32)
        for T, seqs in ((1, None), (37, None), (37, "3 seqs")):
            sq = None if seqs is None else np.sort(rng.integers(1, n_seq, T))[rng.permutation(T)].astype(np.int32)
            case = f"{name} T={T}" + (f" {seqs}" if seqs else "")
            try:
                st_ref, st_dev = state0.copy(), ops.asarray(state0)
                for call_i in range(2):  # the state carries over into the second call
                    inp = make(T)
                    ref = call(ref_ops, inp, consts, st_ref, sq)
                    got = ops.to_numpy(call(ops, {k: ops.asarray(v) for k, v in inp.items()}, dconsts, st_dev, sq))
                    rows.append(row(op, f"{case} call {call_i + 1}", got, ref, 2e-4))
                rows.append(row(op, f"{case} state", ops.to_numpy(st_dev), st_ref, 2e-4))
            except Exception as e:
                rows.append({"op": op, "case": case, "ok": False, "error": f"{type(e).__name__}: {e}"})
        if not hasattr(ops, "capture"):
            continue
        case = f"{name} T=1 captured graph"
        try:
            fixed = {k: ops.asarray(v) for k, v in make(1).items()}
            st_ref, st_dev = state0.copy(), ops.asarray(state0)
            graph, res = ops.capture(lambda: call(ops, fixed, dconsts, st_dev, None))
            try:
                for rep in range(2):
                    inp = make(1)
                    for k, v in inp.items():
                        ops.write(fixed[k], v)
                    graph.launch()
                    ref = call(ref_ops, inp, consts, st_ref, None)
                    rows.append(row(op, f"{case} replay {rep + 1}", ops.to_numpy(res), ref, 2e-4))
                rows.append(row(op, f"{case} state", ops.to_numpy(st_dev), st_ref, 2e-4))
            finally:
                graph.close()
        except Exception as e:
            rows.append({"op": op, "case": case, "ok": False, "error": f"{type(e).__name__}: {e}"})
    return rows
# check_recurrent_chunked: float32 against the float64 sequential recurrence, relative to
# max|ref| over a whole output (or state). The chunked form's float32 error comes from the
# forward substitution of a 64-token unit lower triangular system and from float32 sums of
# at most 2 * 256 products per element (relative ~1e-6 each); carried through the state over
# 513 tokens the numpy float32 emulation of the kernels (tests/test_chunked_recurrence.py)
# stays below 1e-6 on these inputs (7.4e-7 measured; that test asserts < CHUNK_TOL / 10); the
# sequential kernel's per-token rounding is of the same order, and the GPU's expf (2 ulp) and
# FMA contractions change it by small factors. 1e-4 leaves a wide margin and is still far below
# what a wrong index, head, group, chunk boundary or a lost state gives (errors of 0.1 to 1).
CHUNK_TOL = 1e-4
CHUNK_TOKENS = (1, 31, 63, 64, 65, 200, 513)


HYBRID_TOL = 1e-5  # float32 rounding of a few ops (row sums in another order, expf/log1pf ulps)


def check_hybrid_fused(ops, rng):
    """base.py's fused ops of the hybrid layers (delta_gates, ssm_conv_silu, delta_qkv,
    rms_norm_gate, sigmoid_gate) against the numpy backend's plain composition of them, for
    N in {1, 7, 130} tokens (130: three interleaved sequences, the conv's multi-block path) at
    odd and Qwen3.5-2B head shapes; the backend's own methods are called (the fused kernels),
    or base's function where it has none (numpy). Then the one-token chain captured in a graph
    and replayed with new inputs."""
    from reflex_ipc.backends import base
    from reflex_ipc.backends.numpy_ops import NumpyOps

    ref_ops = NumpyOps()
    F = np.float32
    names = ("delta_gates", "ssm_conv_silu", "delta_qkv", "rms_norm_gate", "sigmoid_gate")
    fn = {n: getattr(ops, n, None) or (lambda *a, n=n: getattr(base, n)(ops, *a)) for n in names}
    rows = []

    def inputs(N, nk, nv, d, K):
        C = (2 * nk + nv) * d
        alpha = (rng.standard_normal((N, nv)) * 8).astype(F)
        alpha[0, :2] = [19.9, 25.0]  # both sides of softplus's threshold (dt_bias adds ~0)
        return {"alpha": alpha, "b": (rng.standard_normal((N, nv)) * 4).astype(F),
                "x": rng.standard_normal((N, C)).astype(F),
                "o": rng.standard_normal((N, nv, d)).astype(F), "z": (rng.standard_normal((N, nv, d)) * 3).astype(F),
                "att": rng.standard_normal((N, nv * d)).astype(F),
                "qg": (rng.standard_normal((N, nv, 2 * d)) * 3).astype(F)}

    def chain(o, i, c, st, seqs, nk, nv, d):
        """The five ops as a DeltaNet layer (and a gated attention) calls them: their outputs."""
        call = fn if o is ops else {n: (lambda *a, n=n: getattr(base, n)(ref_ops, *a)) for n in names}
        g, beta = call["delta_gates"](i["alpha"], c["dt_bias"], c["a"], i["b"])
        y = call["ssm_conv_silu"](i["x"], st, c["w"], seqs)
        q, k, v = call["delta_qkv"](y, nk, nv, d, 1e-6)
        gated = call["rms_norm_gate"](i["o"], c["norm"], 1e-6, i["z"])
        sg = call["sigmoid_gate"](i["att"], i["qg"], d, d)
        return {"g": g, "beta": beta, "conv": y, "q": q, "k": k, "v": v, "rms_norm_gate": gated, "sigmoid_gate": sg}

    n_seq, K = 4, 4
    for nk, nv, d in ((1, 3, 19), (2, 6, 37), (16, 16, 128)):
        C = (2 * nk + nv) * d
        consts = {"dt_bias": rng.standard_normal(nv).astype(F) * 0.01, "a": -rng.uniform(0.1, 3, nv).astype(F),
                  "w": (rng.standard_normal((C, K)) * 0.5).astype(F), "norm": rng.standard_normal(d).astype(F)}
        dconsts = {k: ops.asarray(v) for k, v in consts.items()}
        state0 = rng.standard_normal((n_seq, K - 1, C)).astype(F)
        for N in (1, 7, 130):
            seqs = None if N < 130 else np.repeat([1, 3, 2], [60, 10, 60])[rng.permutation(N)].astype(np.int32)
            case = f"nk={nk} nv={nv} d={d} N={N}" + ("" if seqs is None else " 3 seqs")
            try:
                inp = inputs(N, nk, nv, d, K)
                st_ref, st_dev = state0.copy(), ops.asarray(state0)
                ref = chain(ref_ops, inp, consts, st_ref, seqs, nk, nv, d)
                got = chain(ops, {k: ops.asarray(v) for k, v in inp.items()}, dconsts, st_dev, seqs, nk, nv, d)
                for key, r in ref.items():
                    rows.append(row(f"hybrid {key}", case, ops.to_numpy(got[key]), r, HYBRID_TOL))
                rows.append(row("hybrid conv state", case, ops.to_numpy(st_dev), st_ref, 0.0))
            except Exception as e:
                rows.append({"op": "hybrid", "case": case, "ok": False, "error": f"{type(e).__name__}: {e}"})
        if not hasattr(ops, "capture"):
            continue
        case = f"nk={nk} nv={nv} d={d} N=1 captured graph"
        try:
            fixed = {k: ops.asarray(v) for k, v in inputs(1, nk, nv, d, K).items()}
            st_ref, st_dev = state0.copy(), ops.asarray(state0)
            graph, res = ops.capture(lambda: chain(ops, fixed, dconsts, st_dev, None, nk, nv, d))
            try:
                for rep in range(2):
                    inp = inputs(1, nk, nv, d, K)
                    for k, v in inp.items():
                        ops.write(fixed[k], v)
                    graph.launch()
                    ref = chain(ref_ops, inp, consts, st_ref, None, nk, nv, d)
                    for key, r in ref.items():
                        rows.append(row(f"hybrid {key}", f"{case} replay {rep + 1}", ops.to_numpy(res[key]), r,
                                        HYBRID_TOL))
                rows.append(row("hybrid conv state", f"{case}", ops.to_numpy(st_dev), st_ref, 0.0))
            finally:
                graph.close()
        except Exception as e:
            rows.append({"op": "hybrid", "case": case, "ok": False, "error": f"{type(e).__name__}: {e}"})
    return rows


def max_rel(out, ref):
    """max|out - ref| / max|ref| (inf when out is not finite)."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    m = float(np.max(np.abs(ref))) if ref.size else 0.0
    d = float(np.max(np.abs(out - ref))) if out.size else 0.0
    return d / m if m else d


def recurrent_reference(op, inp, consts, state, seqs):
    """The plain sequential float64 recurrence of delta_net / ssm_scan over each sequence's
    tokens (references.py, one sequence at a time): (out [N, H, Dv], new state), state not
    modified."""
    from .references import delta_net_reference, ssm_scan_reference

    first = next(iter(inp.values()))
    N = first.shape[0]
    sq = np.zeros(N, np.int64) if seqs is None else np.asarray(seqs).reshape(-1)
    S = np.array(state, np.float64)
    out = None
    for s in np.unique(sq):
        idx = np.flatnonzero(sq == s)
        if op == "delta_net":
            o, S[s] = delta_net_reference(inp["q"][idx], inp["k"][idx], inp["v"][idx], inp["g"][idx],
                                          inp["beta"][idx], S[s], consts["scale"])
        else:
            o, S[s] = ssm_scan_reference(inp["x"][idx], inp["dt"][idx], consts["A"], inp["B"][idx], inp["C"][idx],
                                         S[s], consts.get("D"))
        if out is None:
            out = np.zeros((N,) + o.shape[1:])
        out[idx] = o
    return out, S


def _chunked_specs(rng):
    """{name: (op, T -> inputs, constants, state shape without the sequence axis)}: delta_net with
    Hv > Hk (value head h reads key head h % Hk), odd and widest key sizes; ssm_scan with G > 1
    groups (head h reads group h / (H / G)), odd sizes, Granite-4.0-H's head (P 64, Ns 128)."""
    F = np.float32

    def l2(a):
        return (a / np.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)).astype(F)

    specs = {}
    for Hk, Hv, D in ((1, 3, 37), (2, 6, 128), (1, 2, 256)):
        specs[f"delta_net Hk={Hk} Hv={Hv} D={D}"] = (
            "delta_net",
            lambda T, Hk=Hk, Hv=Hv, D=D: {
                "q": l2(rng.standard_normal((T, Hk, D))), "k": l2(rng.standard_normal((T, Hk, D))),
                "v": rng.standard_normal((T, Hv, D)).astype(F),
                "g": -np.abs(rng.standard_normal((T, Hv)) * 0.3).astype(F),
                "beta": rng.uniform(0.05, 0.95, (T, Hv)).astype(F)},
            {"scale": 1.0 / np.sqrt(D)}, (Hv, D, D))
    for H, P, G, Ns in ((6, 5, 2, 19), (8, 64, 2, 128), (4, 20, 4, 256)):
        specs[f"ssm_scan H={H} P={P} G={G} Ns={Ns}"] = (
            "ssm_scan",
            lambda T, H=H, P=P, G=G, Ns=Ns: {
                "x": rng.standard_normal((T, H, P)).astype(F),
                "dt": rng.uniform(0.01, 0.5, (T, H)).astype(F),
                "B": (rng.standard_normal((T, G, Ns)) / np.sqrt(Ns)).astype(F),
                "C": (rng.standard_normal((T, G, Ns)) / np.sqrt(Ns)).astype(F)},
            {"A": -rng.uniform(0.3, 3.0, H).astype(F), "D": rng.standard_normal(H).astype(F)}, (H, P, Ns))
    return specs


def _call_recurrent(ops, op, inp, consts, state, seqs):
    if op == "delta_net":
        return ops.delta_net(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], state, seqs, scale=consts["scale"])
    return ops.ssm_scan(inp["x"], inp["dt"], consts["A"], inp["B"], inp["C"], state, seqs, D=consts["D"])


def check_recurrent_chunked(ops, rng):
    """delta_net and ssm_scan of long prefills against the plain sequential float64 recurrence
    (recurrent_reference) and against the numpy backend's op, with a nonzero state carried in
    and checked after: one sequence of CHUNK_TOKENS tokens (around the 64-token chunk), and
    four sequences of 70, 1, 130 and 33 tokens interleaved in one batch. On CUDA (ops with
    `chunked`), each case runs on the chunked kernels (chunk_min forced to 1, so even one
    token takes them) and on the sequential kernels, which must also agree with each other."""
    from reflex_ipc.backends.numpy_ops import NumpyOps

    if not callable(getattr(ops, "delta_net", None)):
        return [{"op": "recurrent_chunked", "case": "missing", "ok": False, "error": "no recurrent ops"}]
    ref_ops = NumpyOps()
    cuda = hasattr(ops, "chunked")
    modes = ("chunked", "sequential") if cuda else ("op",)
    n_seq = 5
    rows = []
    for name, (op, make, consts, sshape) in _chunked_specs(rng).items():
        dconsts = {k: ops.asarray(v) if isinstance(v, np.ndarray) else v for k, v in consts.items()}
        state0 = (rng.standard_normal((n_seq,) + sshape) * 0.3).astype(np.float32)
        lens = (70, 1, 130, 33)
        multi = np.repeat(np.arange(1, 1 + len(lens)), lens)[rng.permutation(sum(lens))].astype(np.int32)
        for T, seqs in [(t, None) for t in CHUNK_TOKENS] + [(sum(lens), multi)]:
            case = f"{name} T={T}" + ("" if seqs is None else f" seqs of {'/'.join(map(str, lens))}")
            try:
                inp = make(T)
                ref, ref_state = recurrent_reference(op, inp, consts, state0, seqs)
                st_np = state0.copy()
                np_out = _call_recurrent(ref_ops, op, inp, consts, st_np, seqs)
                rows.append({"op": op, "case": f"{case} numpy vs sequential f64",
                             "rel_err": max_rel(np_out, ref), "tol": CHUNK_TOL,
                             "ok": max_rel(np_out, ref) <= CHUNK_TOL and max_rel(st_np, ref_state) <= CHUNK_TOL})
                got = {}
                for mode in modes:
                    saved = (ops.chunked, ops.chunk_min) if cuda else None
                    try:
                        if cuda:
                            ops.chunked, ops.chunk_min = mode == "chunked", 1
                        dinp = {k: ops.asarray(v) for k, v in inp.items()}
                        st = ops.asarray(state0.copy())  # numpy asarray: the same array
                        out = ops.to_numpy(_call_recurrent(ops, op, dinp, dconsts, st, seqs))
                        st = ops.to_numpy(st)
                    finally:
                        if cuda:
                            ops.chunked, ops.chunk_min = saved
                    got[mode] = out
                    for what, a, b in (("out vs sequential f64", out, ref), ("state vs sequential f64", st, ref_state),
                                       ("out vs numpy", out, np_out), ("state vs numpy", st, st_np)):
                        e = max_rel(a, b)
                        rows.append({"op": op, "case": f"{case} {mode} {what}", "rel_err": e, "tol": CHUNK_TOL,
                                     "ok": e <= CHUNK_TOL})
                if cuda:
                    e = max_rel(got["chunked"], got["sequential"])
                    rows.append({"op": op, "case": f"{case} chunked vs sequential kernel", "rel_err": e,
                                 "tol": CHUNK_TOL, "ok": e <= CHUNK_TOL})
            except Exception as e:
                rows.append({"op": op, "case": case, "ok": False, "error": f"{type(e).__name__}: {e}"})
    return rows


def bench_recurrent(ops, rng):
    """Device time (us) of one prefill call of delta_net (Qwen3.5's layer: Hk 16, Hv 32, D 128)
    and ssm_scan (a Granite-4.0-H-like layer: H 64, P 64, G 1, Ns 128) over T tokens of one
    sequence, on the chunked kernels and on the sequential ones (CudaOps.chunked False's path)."""
    F = np.float32

    def timed(fn, reps=5):
        fn()
        ops.synchronize()
        return round(_event_ms(ops, lambda r: fn(), reps) * 1e3, 1)

    out = {}
    saved = ops.chunked, ops.chunk_min
    try:
        for T in (64, 512, 1024):
            q = ops.asarray(rng.standard_normal((T, 16, 128)).astype(F) / np.sqrt(128))
            k = ops.asarray(rng.standard_normal((T, 16, 128)).astype(F) / np.sqrt(128))
            v = ops.asarray(rng.standard_normal((T, 32, 128)).astype(F))
            g = ops.asarray(-rng.uniform(0, 0.3, (T, 32)).astype(F))
            b = ops.asarray(rng.uniform(0.1, 0.9, (T, 32)).astype(F))
            st = ops.zeros((1, 32, 128, 128))
            x = ops.asarray(rng.standard_normal((T, 64, 64)).astype(F))
            dt = ops.asarray(rng.uniform(0.01, 0.5, (T, 64)).astype(F))
            A = ops.asarray(-rng.uniform(0.3, 3.0, 64).astype(F))
            B = ops.asarray(rng.standard_normal((T, 1, 128)).astype(F) / np.sqrt(128))
            C = ops.asarray(rng.standard_normal((T, 1, 128)).astype(F) / np.sqrt(128))
            sst = ops.zeros((1, 64, 64, 128))
            for mode in ("chunked", "sequential"):
                ops.chunked, ops.chunk_min = mode == "chunked", 1
                out[f"delta_net T={T} {mode}_us"] = timed(lambda: ops.delta_net(q, k, v, g, b, st, None, 0.1))
                out[f"ssm_scan T={T} {mode}_us"] = timed(lambda: ops.ssm_scan(x, dt, A, B, C, sst, None))
    finally:
        ops.chunked, ops.chunk_min = saved
    print("[bench] recurrent prefill: " + ", ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    return out


def bench_gemm(ops, rng):
    """TFLOP/s of prefill-shaped matmuls (N=512 tokens) by type and shape, on the
    tensor-core kernels and on the per-row kernels (ops.mma off), and of the gated unit
    (gate+up [3072, 1024], matmul_glu). 2*N*M*K flops per matmul (per weight for glu)."""
    out = []
    drv = ops.rt.drv
    N = 512
    mma0 = ops.mma
    configs = [(name, M, K) for name in ("Q8_0", "Q4_K", "Q6_K", "F16") for M, K in ((3072, 1024), (1024, 3072))]
    try:
        for name, M, K in configs:
            W = _weights(ops, {"w": (name, M, K), "u": (name, M, K)}, rng)
            w, u = W["w"][0], W["u"][0]
            x = ops.asarray(rng.standard_normal((N, K)).astype(np.float32))
            y = ops.empty((N, M))
            res = {"type": name, "N": N, "M": M, "K": K}
            for mode in (True, False):
                ops.mma = mode and mma0
                for tag, fn, flops in (("", lambda: ops.matmul(x, w, out=y), 2 * N * M * K),
                                       ("glu_", lambda: ops.matmul_glu(x, w, u), 4 * N * M * K)):
                    fn()
                    ops.synchronize()
                    ms = _event_ms(ops, lambda r: fn(), 20 if mode else 5)
                    key = f"{tag}{'mma' if mode else 'rows'}"
                    res[f"{key}_us"] = round(ms * 1e3, 1)
                    res[f"{key}_tflops"] = round(flops / (ms / 1e3) / 1e12, 2)
            res["speedup"] = round(res["rows_us"] / res["mma_us"], 2)
            out.append(res)
        out.append(_bench_model_layer(ops, rng, drv, N, mma0))
        # where the tensor-core kernels start to pay (CudaOps.MMA_MIN_N): short prompts
        for name, M, K in (("Q8_0", 1024, 1024), ("Q8_0", 3072, 1024), ("Q4_K", 1024, 3072)):
            w = _weights(ops, {"w": (name, M, K)}, rng)["w"][0]
            res = {"type": name, "M": M, "K": K, "sweep_us": {}}
            for n in (16, 32, 64, 128, 256):
                x = ops.asarray(rng.standard_normal((n, K)).astype(np.float32))
                y = ops.empty((n, M))
                times = []
                for mode in (True, False):
                    ops.mma = mode and mma0
                    ops.mma_min_n = 1
                    ops.matmul(x, w, out=y)
                    ops.synchronize()
                    times.append(round(_event_ms(ops, lambda r: ops.matmul(x, w, out=y), 20) * 1e3, 1))
                    del ops.mma_min_n
                res["sweep_us"][f"N={n} mma/rows"] = times
            out.append(res)
    finally:
        ops.mma = mma0
        if "mma_min_n" in vars(ops):
            del ops.mma_min_n
    return out


# the matmuls of one layer of a Qwen3-0.6B-shaped model (hidden 1024, q 2048 = 16 heads x
# 128, k/v 1024, ff 3072, 28 layers) as its prefill runs them: q/k/v in one matmul_n, o,
# gate/up in one matmul_glu, down (name, M, K, weights)
QWEN3_06B_LAYER = (("qkv", (2048, 1024, 1024), 1024), ("o", (1024,), 2048), ("glu", (3072,), 1024),
                   ("down", (1024,), 3072))
QWEN3_06B_LAYERS = 28


def _bench_model_layer(ops, rng, drv, N, mma0):
    """us per call of each matmul of a Qwen3-0.6B layer at N tokens, tensor-core and per-row
    kernels, and their sum per layer and for the 28 layers (the prefill's matmul time; a
    512-token prefill at llama.cpp's ~30-60k tok/s takes ~10-15 ms in all)."""
    res = {"model": "qwen3-0.6b-shaped layer", "N": N}
    for name in ("Q8_0", "Q4_K"):
        specs = {}
        for op, Ms, K in QWEN3_06B_LAYER:
            for i, M in enumerate(Ms if op != "glu" else Ms * 2):
                specs[f"{op}{i}"] = (name, M, K)
        W = _weights(ops, specs, rng)
        w = {k: v[0] for k, v in W.items()}
        xs = {K: ops.asarray(rng.standard_normal((N, K)).astype(np.float32)) for K in (1024, 2048, 3072)}
        y = {M: ops.empty((N, M)) for M in (1024, 3072)}
        calls = {"qkv": lambda: ops.matmul_n(xs[1024], [w["qkv0"], w["qkv1"], w["qkv2"]]),
                 "o": lambda: ops.matmul(xs[2048], w["o0"], out=y[1024]),
                 "glu": lambda: ops.matmul_glu(xs[1024], w["glu0"], w["glu1"]),
                 "down": lambda: ops.matmul(xs[3072], w["down0"], out=y[1024])}
        for mode in (True, False):
            ops.mma = mode and mma0
            tag = "mma" if mode else "rows"
            layer = 0.0
            for op, fn in calls.items():
                fn()
                ops.synchronize()
                us = _event_ms(ops, lambda r: fn(), 20 if mode else 5) * 1e3
                res[f"{name} {op} {tag}_us"] = round(us, 1)
                layer += us
            res[f"{name} layer {tag}_us"] = round(layer, 1)
            res[f"{name} model x{QWEN3_06B_LAYERS} {tag}_ms"] = round(layer * QWEN3_06B_LAYERS / 1e3, 2)
            res[f"{name} matmul-only tok/s {tag}"] = round(N / (layer * QWEN3_06B_LAYERS / 1e6))
        ops.mma = mma0
    print(f"[bench] qwen3-0.6b-shaped matmuls, N={N}: " +
          ", ".join(f"{k}={v}" for k, v in res.items() if "layer" in k or "model" in k or "tok/s" in k),
          flush=True)
    return res


def check_iq(ops, rng):
    """The IQ formats, TQ1_0, TQ2_0 and MXFP4 (CUDA: kernels/iq_all.cu's families, in their own
    fatbin) through every matmul path, against float64 products with the weights dequantized by
    quants.py: one token (a block per row; a warp per row on a weight of more rows than
    cuda_ops.MM_SPLIT_ROWS), 2..63 tokens (mmt), 64+ (the tensor-core tiles, K not a multiple of
    their 64-column slices for the 32-value formats), plain and accumulate; the embedding rows;
    q/k/v in one launch; gate/up (silu, gelu); the RMSNorm-folded one-token ops; head_matmul
    (MLA's per-head weights) where the backend has it; the routed experts (moe) against
    NumpyOps.moe (and their grouped tensor-core GEMMs from moe_mma_min_n tokens where the backend
    has them, within MMA_TOL); a one-token step replayed from a captured graph; MLA's long prefill
    with IQ attn_k_b / attn_v_b (CUDA's decompressed path). Outputs poisoned first. On the cpu
    backend (its int8 activation rounding) the bound is CPU_ACT_TOL."""
    from reflex_ipc.backends.base import rms_norm_matmul_glu, rms_norm_matmul_n
    from reflex_ipc.backends.numpy_ops import NumpyOps

    cpu = getattr(ops, "name", "") == "cpu"

    def tol(N):
        return CPU_ACT_TOL if cpu else (MMA_TOL if getattr(ops, "mma", False) and N >= ops.mma_min_n else MM_TOL)

    rows = []
    npo = NumpyOps()
    for name in IQ_TYPES:
        blk = TYPES[name][1]
        K = 768 if blk == 256 else 352  # 352: 5.5 slices of the tensor-core tiles
        W = _weights(ops, {"a": (name, 203, K), "b": (name, 203, K), "c": (name, 70, K), "d": (name, 57, K),
                           "wide": (name, 16500, 256)}, rng)
        (wa, ra), (wb, rb), (wc, rc), (wd, rd) = W["a"], W["b"], W["c"], W["d"]
        for N in (1, 3, 8, 13, 63, 64, 100):
            x = rng.standard_normal((N, K)).astype(np.float32)
            X, x64 = ops.asarray(x), x.astype(np.float64)
            poison(ops, (N, 203))
            rows.append(row("iq_matmul", f"{name} K={K} N={N}", ops.to_numpy(ops.matmul(X, wa)), x64 @ ra.T, tol(N)))
            if N in (1, 9, 13, 100):
                y0 = rng.standard_normal((N, 203)).astype(np.float32)
                Y = ops.asarray(y0.copy())
                ops.matmul(X, wa, out=Y, accumulate=True)
                rows.append(row("iq_matmul", f"{name} K={K} N={N} accumulate", ops.to_numpy(Y), y0 + x64 @ ra.T,
                                tol(N)))
            if N in (1, 13, 100):
                poison(ops, (N, 203), (N, 70), (N, 57))
                outs = ops.matmul_n(X, [wa, wc, wd])
                for i, (out, r) in enumerate(zip(outs, (ra, rc, rd))):
                    rows.append(row("iq_matmul_n", f"{name} N={N} out{i}", ops.to_numpy(out), x64 @ r.T, tol(N)))
                xg = (x * 2 / np.std(x64 @ ra.T)).astype(np.float32)  # gate values of a few units
                g64, u64 = xg.astype(np.float64) @ ra.T, xg.astype(np.float64) @ rb.T
                for act in ("silu", "gelu"):
                    poison(ops, (N, 203))
                    out = ops.to_numpy(ops.matmul_glu(ops.asarray(xg), wa, wb, act=act))
                    rows.append(row("iq_matmul_glu", f"{name} {act} N={N}", out, glu_ref(g64, u64, act), 2 * tol(N)))
        # one token, a weight of more rows than a block-per-row launch takes (CUDA: mm1)
        x = rng.standard_normal((1, 256)).astype(np.float32)
        wide, rwide = W["wide"]
        rows.append(row("iq_matmul", f"{name} M=16500 K=256 N=1", ops.to_numpy(ops.matmul(ops.asarray(x), wide)),
                        x.astype(np.float64) @ rwide.T, tol(1)))
        ids = np.array([0, 5, 202, 17, 5], dtype=np.int32)
        rows.append(row("iq_get_rows", name, ops.to_numpy(ops.embed(wa, ids, scale=0.5)), ra[ids] * 0.5, 1e-6))
        # the RMSNorm folded into the one-token q/k/v and gate/up (CUDA: mmnorm1 / mmgnorm1)
        x = (rng.standard_normal((1, K)) * 3 + 0.5).astype(np.float32)
        nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
        X, NW = ops.asarray(x), ops.asarray(nw)
        h = _rms64(x, nw, 1e-6)
        poison(ops, (1, 203), (1, 70), (1, 57))
        for i, (out, r) in enumerate(zip(rms_norm_matmul_n(ops, X, NW, 1e-6, [wa, wc, wd]), (ra, rc, rd))):
            rows.append(row("iq_rms_norm_matmul_n", f"{name} out{i}", ops.to_numpy(out), h @ r.T, tol(1)))
        hs = _rms64(x, nw * np.float32(2 / np.std(h @ ra.T)), 1e-6)  # gate values of a few units
        NWs = ops.asarray((nw * np.float32(2 / np.std(h @ ra.T))).astype(np.float32))
        out = ops.to_numpy(rms_norm_matmul_glu(ops, X, NWs, 1e-6, wa, wb, act="silu"))
        rows.append(row("iq_rms_norm_matmul_glu", name, out, glu_ref(hs @ ra.T, hs @ rb.T, "silu"), 2 * tol(1)))
        # MLA's per-head weights: x [N, H, K] by [H * M, K]
        if getattr(ops, "head_matmul", None) is not None:
            Wh = _weights(ops, {"h": (name, 3 * 37, K)}, rng)["h"]
            for N in (1, 5, 13):
                x = rng.standard_normal((N, 3, K)).astype(np.float32)
                poison(ops, (N, 3, 37))
                got = ops.to_numpy(ops.head_matmul(ops.asarray(x), Wh[0]))
                want = np.einsum("nhk,hmk->nhm", x.astype(np.float64), Wh[1].reshape(3, 37, K))
                rows.append(row("iq_head_matmul", f"{name} N={N}", got, want, tol(N)))
        # routed experts: every weight of the format, against numpy's moe on the dequantized weights
        E, k, F, Km, D = 8, 2, (256 if blk == 256 else 224), 512, 203
        Wm = _weights(ops, {"gate": (name, E * F, Km), "up": (name, E * F, Km), "down": (name, E * D, F),
                            "router": ("F32", E, Km)}, rng)
        ref = {key: v[1].astype(np.float32) for key, v in Wm.items()}
        # prefill: the grouped tensor-core GEMMs where the backend has them (moe_mma), x small
        # enough that the gated rows fit the f16 they are stored in between the two GEMMs
        grouped = getattr(ops, "moe_mma", False)
        xs = min(0.5, 2.0 / (float(np.std(ref["gate"])) * np.sqrt(Km) + 1e-30))
        for N in (1, 3, 17) + ((ops.moe_mma_min_n, 70) if grouped else ()):
            big = grouped and N >= ops.moe_mma_min_n
            x = _moe_inputs(rng, N, Km, E, k, "softmax", None, None, router=ref["router"].astype(np.float64),
                            xs=xs if big else 0.5)[0]
            with np.errstate(over="ignore"):
                want = npo.moe(x, ref["router"], ref["gate"], ref["up"], ref["down"], k)
            poison(ops, (N, D), (N * k, F))
            before = getattr(ops, "moe_mma_launches", 0)
            got = ops.moe(ops.asarray(x), Wm["router"][0], Wm["gate"][0], Wm["up"][0], Wm["down"][0], k)
            r = row("iq_moe", f"{name} E={E} k={k} N={N}" + (" grouped" if big else ""), ops.to_numpy(got), want,
                    MMA_TOL if big else 3 * CPU_ACT_TOL if cpu else 1e-4)  # cpu: three roundings chained
            if big and ops.moe_mma_launches != before + 1:
                r["ok"], r["error"] = False, "the grouped path was not taken"
            rows.append(r)
        # a one-token step (q/k/v, gate/up, down) from a captured graph, replayed on a new x
        if hasattr(ops, "capture"):
            X = ops.asarray(rng.standard_normal((1, K)).astype(np.float32))
            g, outs = ops.capture(lambda: ops.matmul_n(X, [wa, wc]) + [ops.matmul_glu(X, wa, wb)])
            try:
                x2 = rng.standard_normal((1, K)).astype(np.float32)
                ops.write(X, x2)
                g.launch()
                x64 = x2.astype(np.float64)
                refs = [x64 @ ra.T, x64 @ rc.T, glu_ref(x64 @ ra.T, x64 @ rb.T, "silu")]
                for i, (o, r) in enumerate(zip(outs, refs)):
                    rows.append(row("iq_graph", f"{name} out{i}", ops.to_numpy(o), r, 2 * tol(1)))
            finally:
                g.close()
    # MLA's long prefill (CUDA: attn_k_b transposed by mla_kb_t_*, attn_v_b's tensor-core GEMM,
    # the flash kernel) with IQ weights: attn_k_b's 128 columns take the 32-value formats only
    if getattr(ops, "head_matmul", None) is not None:
        kv16 = getattr(ops, "kv_dtype", "float32")
        exact = getattr(ops, "exact_kv_dtype", None) or kv16
        rows += _mla_prefill_rows(ops, rng, (("IQ4_NL", "IQ4_XS", (130,), False, exact),
                                             ("MXFP4", "IQ2_XXS", (140, 128), False, kv16)),
                                  op="iq_mla_prefill", tol=3 * CPU_ACT_TOL if cpu else 1e-4)
    return rows


def run_all(ops, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for fn in (check_matmul, check_matmul_prefill, check_elementwise, check_attention, check_flash_attention,
               check_attention_sinks_chunks, check_archops, check_sampling,
               check_matmul_n, check_matmul_glu, check_rms_norm_rope, check_mla, check_mla_prefill, check_recurrent,
               check_recurrent_chunked, check_hybrid_fused,
               check_moe, check_moe_mv, check_moe_grouped, check_rms_norm_matmul_n, check_rms_norm_matmul_glu,
               check_qk_rope_kv_store, check_residual_add,
               check_matvec, check_matmul_nt):
        try:
            rows += fn(ops, rng)
        except Exception as e:  # a crash is a failed check, reported with the rest
            import traceback

            rows.append({"op": fn.__name__, "case": "crashed", "ok": False,
                         "error": "".join(traceback.format_exception(e))[-2000:]})
    return rows
