"""The cpu backend (backends/cpu_ops.py, kernels/cpu/*.c) against numpy.

- Kernels: every weight type's matmul on random blocks (odd row counts, several block
  counts, batches of 1 and many) against numpy's dequantization times the activations
  rounded exactly as the kernels round them (int8 per block of 32 or 256 values): the
  integer dot products must be exact, so the bound is float32 rounding (1e-5). Against
  the unrounded activations the error is the activation rounding, bounded loosely.
  Every x86 code path (portable C, AVX2, AVX-512 VNNI) gives the same results.
- Ops: every op of backends/base.py against NumpyOps (the oracle) on random inputs.
- Graphs: a recorded step replays to the eager result on new inputs.
- Models: greedy generation on the synthetic GGUFs and SmolLM2 matches the numpy
  backend under the near-tie rule, and log-probabilities stay within measured bounds.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex_ipc.backends import cpu_ops
from reflex_ipc.backends.base import missing_ops
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.ggml_types import TYPES
from reflex_ipc.quants import dequantize

from reflex_ipc.testing.opchecks import weights_gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if not cpu_ops.available()[0]:  # pragma: no cover - the build is part of the install
    raise RuntimeError(f"the CPU kernels are not built: {cpu_ops.available()[1]} "
                       "(python3 kernels/cpu/build.py)")

F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
              "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64]}
# the formats of kernels/cpu/iq.c (IQ1_M's d is spread over its scale words; MXFP4's is a
# power of two: random_weight sets them)
IQ = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0",
      "TQ2_0", "MXFP4"]
QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q8_K"] + IQ
FLOAT = ["F32", "F16", "BF16"]
# the formats whose activations are rounded per 256 values (others: 32)
ACT_BLOCK = {t: 256 for t in ["Q4_K", "Q5_K", "Q6_K", "Q8_K"] + IQ if t not in ("IQ4_NL", "MXFP4")}


def random_weight(name, rows, cols, rng):
    """(raw bytes, float64 dequantized [rows, cols]) of random blocks with sane scales."""
    tid, blk, bsize = TYPES[name]
    n = rows * cols
    if name == "F32":
        raw = (rng.standard_normal(n) * 0.05).astype(np.float32).view(np.uint8)
    elif name == "F16":
        raw = (rng.standard_normal(n) * 0.05).astype(np.float16).view(np.uint8)
    elif name == "BF16":
        w = (rng.standard_normal(n) * 0.05).astype(np.float32)
        raw = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        nb = n // blk
        raw = rng.integers(0, 256, (nb, bsize), dtype=np.uint8)
        if name == "Q8_K":
            raw[:, :4] = (rng.uniform(0.2, 1, (nb, 1)) * 0.01).astype("<f4").view(np.uint8)
        for off in F16_FIELDS.get(name, []):
            s = (rng.uniform(0.2, 1.0, nb) * 0.01 * rng.choice([-1, 1], nb)).astype(np.float16)
            raw[:, off:off + 2] = s.view(np.uint8).reshape(nb, 2)
        if name == "IQ1_M":  # d in the top nibbles of the 4 scale words at bytes 48..55
            h = (rng.uniform(0.2, 1.0, nb) * 0.01 * rng.choice([-1, 1], nb)).astype("<f2").view("<u2")
            sc = np.ascontiguousarray(raw[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
            for k in range(4):
                sc[:, k] |= ((h >> (4 * k)) & 0xF).astype(np.uint16) << 12
            raw[:, 48:56] = sc.view(np.uint8)
        if name == "MXFP4":  # E8M0: 2^(e - 127), here 2^-8 .. 2^-5
            raw[:, 0] = rng.integers(119, 123, nb)
        raw = raw.reshape(-1)
    raw = np.ascontiguousarray(raw)
    return raw, dequantize(raw, tid, n).astype(np.float64).reshape(rows, cols)


def rounded_activations(x, blk):
    """x [N, K] rounded as the kernels round it: per block, d = max|x| / 127 and
    q = round-half-even(x * (1 / d)), all in float32; returns d * q in float64."""
    N, K = x.shape
    xb = x.reshape(N, K // blk, blk).astype(np.float32)
    d = (np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv)
    return (q.astype(np.float64) * d).reshape(N, K)


@pytest.fixture(scope="module")
def ops():
    return cpu_ops.CpuOps()


@pytest.fixture(scope="module")
def ref_ops():
    return NumpyOps(blas_threads=None)


def load(ops, name, raw, rows, cols):
    return ops.load_weight(weights_gguf({"w": (raw, TYPES[name][0], (rows, cols))}), "w")


def test_conforms(ops):
    assert missing_ops(ops) == []
    assert ops.name == "cpu" and ops.device == "cpu" and ops.kv_dtype in ("float16", "float32")
    assert ops.isa in ("generic", "avx2", "avx512vnni", "neon", "dotprod", "i8mm") and ops.threads >= 1


# --- kernels ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", QUANT + FLOAT)
@pytest.mark.parametrize("N", [1, 5, 67])
def test_matmul_every_type(ops, name, N):
    rng = np.random.default_rng(hash((name, N)) % 2**32)
    blk = TYPES[name][1]
    rows = 37  # odd: the last chunk of rows is partial
    cols = 768 if blk == 256 else 160  # 3 super-blocks / 5 blocks
    raw, wref = random_weight(name, rows, cols, rng)
    w = load(ops, name, raw, rows, cols)
    assert isinstance(w, cpu_ops.CpuWeight) and w.shape == (rows, cols)
    assert w.raw.ctypes.data == w.desc.data  # read in place: no copy at load
    x = rng.standard_normal((N, cols)).astype(np.float32)
    y = ops.matmul(x, w)
    assert y.shape == (N, rows) and y.dtype == np.float32
    scale = np.abs(x).astype(np.float64) @ np.abs(wref).T  # the size of the terms summed
    exact = x.astype(np.float64) @ wref.T
    if name in FLOAT:
        assert np.all(np.abs(y - exact) <= 1e-5 * scale + 1e-30)
        return
    xr = rounded_activations(x, ACT_BLOCK.get(name, 32))
    want = xr @ wref.T
    err = np.abs(y - want) / scale
    assert err.max() <= 1e-5, f"{name}: {err.max():.3g} against the rounded activations"
    # the rounding itself: at most half a step (max|x| / 254) per value
    assert (np.abs(y - exact) / scale).max() <= 1e-2


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "F16"])
def test_matmul_leading_axes_out_accumulate(ops, name):
    rng = np.random.default_rng(3)
    cols = 256
    raw, wref = random_weight(name, 19, cols, rng)
    w = load(ops, name, raw, 19, cols)
    x = rng.standard_normal((2, 3, cols)).astype(np.float32)
    y = ops.matmul(x, w)
    assert y.shape == (2, 3, 19)
    np.testing.assert_array_equal(y.reshape(6, 19), ops.matmul(x.reshape(6, cols), w))
    out = rng.standard_normal((2, 3, 19)).astype(np.float32)
    before = out.copy()
    assert ops.matmul(x, w, out=out, accumulate=True) is out
    np.testing.assert_allclose(out, before + y, rtol=1e-6, atol=1e-6)
    out2 = np.empty((2, 3, 19), np.float32)
    ops.matmul(x, w, out=out2)
    np.testing.assert_array_equal(out2, y)
    with pytest.raises(ValueError):
        ops.matmul(x[..., :128], w)


@pytest.mark.parametrize("name", QUANT)
def test_batched_paths_agree(ops, name):
    """Prompt passes: the panels (x86, N >= 8: the weight rows unpacked once per chunk into an
    interleaved panel) return the tiles' results (N = 4..7) bit for bit for the rows the tiles
    cover, with a partial panel at the end, accumulating, and in gated units."""
    rng = np.random.default_rng(hash(name) % 2**32)
    cols = 768 if TYPES[name][1] == 256 else 160
    rows = 37  # 4 whole panels and 5 rows; the tiles cover rows 0..35, dot the last
    raw, _ = random_weight(name, rows, cols, rng)
    w = load(ops, name, raw, rows, cols)
    x = rng.standard_normal((21, cols)).astype(np.float32)
    full = ops.matmul(x, w)
    for n0 in range(0, 20, 4):
        np.testing.assert_array_equal(full[n0:n0 + 4, :36], ops.matmul(x[n0:n0 + 4], w)[:, :36])
    base = rng.standard_normal((21, rows)).astype(np.float32)
    out = base.copy()
    ops.matmul(x, w, out=out, accumulate=True)
    np.testing.assert_array_equal(out, base + full)
    g = ops.matmul_glu(x, w, w, act="gelu")
    np.testing.assert_array_equal(g[:4, :36], ops.matmul_glu(x[:4], w, w, act="gelu")[:, :36])


def _isa_results(isa):
    code = (
        "import sys, json, numpy as np\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
        "import test_cpu_ops as t\n"
        "from reflex_ipc.backends.cpu_ops import CpuOps\n"
        "ops = CpuOps(threads=2)\n"
        "out = {'isa': ops.isa}\n"
        "for name in t.QUANT + t.FLOAT:\n"
        "    rng = np.random.default_rng(11)\n"
        "    cols = 512\n"
        "    raw, _ = t.random_weight(name, 9, cols, rng)\n"
        "    w = t.load(ops, name, raw, 9, cols)\n"
        "    out[name] = ops.matmul(rng.standard_normal((3, cols)).astype(np.float32), w).tolist()\n"
        "print(json.dumps(out))\n")
    env = dict(os.environ, REFLEX_CPU_ISA=isa)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=1800)  # minutes under qemu-aarch64 (scripts/aarch64-check)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_code_path_agrees():
    """The portable C kernels and the x86 ones compute the same integer sums; the aarch64
    ones (neon.c) return generic.c's results bit for bit."""
    import platform

    base = _isa_results("generic")
    assert base["isa"] == "generic"
    arm = platform.machine().lower() in ("aarch64", "arm64")
    others = [_isa_results(i) for i in (("neon", "dotprod", "auto") if arm else ("avx2", "auto"))]
    for res in others:
        for name in QUANT + FLOAT:
            if arm:
                assert res[name] == base[name], f"{name} on {res['isa']}"
            else:
                np.testing.assert_allclose(res[name], base[name], rtol=2e-5, atol=1e-6,
                                           err_msg=f"{name} on {res['isa']}")


BATCH_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17]


def _batch_invariance(isa):
    """Run in a process on kernel set `isa`: for every weight type, the rows of a matmul (and of
    a gated unit) of N activation rows whose bits differ from the same row computed alone."""
    code = (
        "import sys, json, numpy as np\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
        "import test_cpu_ops as t\n"
        "from reflex_ipc.backends.cpu_ops import CpuOps\n"
        "ops = CpuOps(threads=2)\n"
        "out = {'isa': ops.isa, 'bad': []}\n"
        "for name in t.QUANT + ['F16', 'BF16']:  # F32 weights: BLAS past 4 rows (cpu_ops.matmul)\n"
        "    rng = np.random.default_rng(17)\n"
        "    rows, cols = 37, 1024  # 2 whole panels of 16 and 5 rows; tiles for 36 rows, a dot for 1\n"
        "    ws = [t.load(ops, name, t.random_weight(name, rows, cols, rng)[0], rows, cols) for _ in range(2)]\n"
        f"    x = rng.standard_normal(({max(BATCH_SIZES)}, cols)).astype(np.float32)\n"
        "    alone = [ops.matmul(x[n:n + 1], ws[0])[0] for n in range(len(x))]\n"
        "    alone_glu = [ops.matmul_glu(x[n:n + 1], ws[0], ws[1])[0] for n in range(len(x))]\n"
        f"    for N in {BATCH_SIZES!r}:\n"
        "        y, g = ops.matmul(x[:N], ws[0]), ops.matmul_glu(x[:N], ws[0], ws[1])\n"
        "        for n in range(N):\n"
        "            if y[n].tobytes() != alone[n].tobytes():\n"
        "                out['bad'].append(f'{name} matmul N={N} row {n}')\n"
        "            if g[n].tobytes() != alone_glu[n].tobytes():\n"
        "                out['bad'].append(f'{name} glu N={N} row {n}')\n"
        "print(json.dumps(out))\n")
    env = dict(os.environ, REFLEX_CPU_ISA=isa)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=1800)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("isa", ["generic", "avx2", "auto"])
def test_batch_invariant(isa):
    """Each output row of a matmul or gated unit of N activation rows (tiles, panels, dot2, the
    rows left over: x86's every path) has exactly the bits of that row computed alone (a
    one-token step): a prompt gives the same logits whether prefilled whole or after a reused
    prefix. x86: the AVX2 build and the default one (AVX-512 VNNI where the CPU has it)."""
    import platform

    machine = platform.machine().lower()
    if isa == "avx2" and machine not in ("x86_64", "amd64"):
        isa = "neon"  # aarch64: the base NEON kernels in its place
    res = _batch_invariance(isa)
    if isa != "auto":
        assert res["isa"] == isa
    assert not res["bad"], f"{res['isa']}: {len(res['bad'])} rows differ, e.g. {res['bad'][:8]}"


# --- ops against the oracle ----------------------------------------------------------------
MIXED = [("Q4_1", "Q4_1", "Q8_0"), ("Q4_K", "Q6_K", "Q5_0"), ("F16", "Q8_0", "Q4_0")]


@pytest.mark.parametrize("types", MIXED)
@pytest.mark.parametrize("N", [1, 9])
def test_matmul_n_and_glu(ops, ref_ops, types, N):
    rng = np.random.default_rng(5)
    cols = 512
    shapes = [48, 16, 24]
    ws, wr = [], []
    for t, rows in zip(types, shapes):
        raw, _ = random_weight(t, rows, cols, rng)
        f = weights_gguf({"w": (raw, TYPES[t][0], (rows, cols))})
        ws.append(ops.load_weight(f, "w"))
        wr.append(ref_ops.load_weight(f, "w"))
    x = rng.standard_normal((N, cols)).astype(np.float32)
    got = ops.matmul_n(x, ws)
    for y, w in zip(got, ws):
        np.testing.assert_array_equal(y, ops.matmul(x, w))
    for act in ("silu", "gelu"):
        raw_g, _ = random_weight(types[0], 40, cols, rng)
        raw_u, _ = random_weight(types[1], 40, cols, rng)
        f = weights_gguf({"g": (raw_g, TYPES[types[0]][0], (40, cols)), "u": (raw_u, TYPES[types[1]][0], (40, cols))})
        g, u = ops.load_weight(f, "g"), ops.load_weight(f, "u")
        y = ops.matmul_glu(x, g, u, act=act)
        glu = ops.swiglu if act == "silu" else ops.geglu
        np.testing.assert_allclose(y, glu(ops.matmul(x, g), ops.matmul(x, u)), rtol=1e-5, atol=1e-6)
        with np.errstate(over="ignore"):  # silu of large negative gates: exp overflows to inf, 0 results
            want = ref_ops.matmul_glu(x, ref_ops.load_weight(f, "g"), ref_ops.load_weight(f, "u"), act=act)
        assert np.abs(y - want).max() <= 2e-2 * np.abs(want).max()
    with pytest.raises(ValueError):
        ops.matmul_glu(x, ws[0], ws[1])


@pytest.mark.parametrize("name", QUANT + FLOAT)
def test_embed(ops, ref_ops, name):
    rng = np.random.default_rng(8)
    cols = 512
    raw, _ = random_weight(name, 23, cols, rng)
    f = weights_gguf({"w": (raw, TYPES[name][0], (23, cols))})
    w, wr = ops.load_weight(f, "w"), ref_ops.load_weight(f, "w")
    for ids in ([0], [22, 3, 3, 7], list(range(23)) * 2):
        for scale in (1.0, 2.5):
            got = ops.embed(w, ids, scale=scale)
            np.testing.assert_allclose(got, ref_ops.embed(wr, ids, scale=scale), rtol=1e-6, atol=0)
    with pytest.raises(ValueError):
        ops.embed(w, [23])


@pytest.mark.parametrize("gating,types", [("softmax", ("Q4_K", "Q4_K", "Q6_K")), ("sigmoid", ("Q8_0", "Q4_0", "Q8_0"))])
def test_moe_and_weight_rows(ops, ref_ops, gating, types):
    rng = np.random.default_rng(21)
    E, F, K, D, N = 6, 32, 256, 256, 5
    specs = {"router": ("F32", (E, K)), "gate": (types[0], (E * F, K)), "up": (types[1], (E * F, K)),
             "down": (types[2], (E * D, F if types[2] not in ACT_BLOCK else 256))}
    if types[2] in ACT_BLOCK:  # K-quant rows need 256 columns: widen the experts' hidden size
        F = 256
        specs["gate"], specs["up"] = (types[0], (E * F, K)), (types[1], (E * F, K))
        specs["down"] = (types[2], (E * D, F))
    tensors = {}
    for name, (t, shape) in specs.items():
        raw, _ = random_weight(t, shape[0], shape[1], rng)
        tensors[name] = (raw, TYPES[t][0], shape)
    f = weights_gguf(tensors)
    cw = {n: ops.load_weight(f, n) for n in specs}
    rw = {n: ref_ops.load_weight(f, n) for n in specs}
    x = rng.standard_normal((N, K)).astype(np.float32)
    got = ops.moe(x, cw["router"], cw["gate"], cw["up"], cw["down"], 2, gating=gating)
    with np.errstate(over="ignore"):
        want = ref_ops.moe(x, rw["router"], rw["gate"], rw["up"], rw["down"], 2, gating=gating)
    assert got.shape == want.shape == (N, D)
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()
    part = ops.weight_rows(cw["gate"], F, F)
    np.testing.assert_array_equal(ops.matmul(x, part), ops.matmul(x, cw["gate"])[:, F:2 * F])
    with pytest.raises(ValueError):
        ops.weight_rows(cw["gate"], E * F - 1, 2)


def test_topk(ops, ref_ops):
    z = np.array([[0.5, 2.0, 2.0, -1.0, 3.0]], np.float32)
    np.testing.assert_array_equal(ops.topk(z, 3), ref_ops.topk(z, 3))
    np.testing.assert_array_equal(ops.topk(z, 9, n=4), ref_ops.topk(z, 9, n=4))


def test_elementwise(ops, ref_ops):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((5, 64)).astype(np.float32) * 3
    b = rng.standard_normal((5, 64)).astype(np.float32)
    row = rng.standard_normal(64).astype(np.float32)
    for fn in ("add", "mul"):
        for other in (b, row):
            np.testing.assert_allclose(getattr(ops, fn)(a, other), getattr(ref_ops, fn)(a, other), rtol=1e-6)
        out = np.empty_like(a)
        assert getattr(ops, fn)(a, b, out=out) is out
        np.testing.assert_allclose(out, getattr(ref_ops, fn)(a, b), rtol=1e-6)
    np.testing.assert_allclose(ops.scale(a, 0.3), ref_ops.scale(a, 0.3), rtol=1e-6)
    np.testing.assert_allclose(ops.softcap(a, 2.0), ref_ops.softcap(a, 2.0), rtol=1e-5, atol=1e-6)
    for fn in ("silu", "gelu"):
        np.testing.assert_allclose(getattr(ops, fn)(a), getattr(ref_ops, fn)(a), rtol=1e-5, atol=1e-6)
    for fn in ("swiglu", "geglu"):
        np.testing.assert_allclose(getattr(ops, fn)(a, b), getattr(ref_ops, fn)(a, b), rtol=1e-5, atol=1e-6)
    # non-contiguous inputs still work (in numpy)
    np.testing.assert_allclose(ops.add(a[:, ::2], b[:, ::2]), a[:, ::2] + b[:, ::2])


@pytest.mark.parametrize("shape,wshape", [((3, 96), (96,)), ((4, 5, 64), (64,)), ((2, 80), None)])
def test_rms_norm(ops, ref_ops, shape, wshape):
    rng = np.random.default_rng(10)
    x = rng.standard_normal(shape).astype(np.float32) * 4
    w = None if wshape is None else rng.standard_normal(wshape).astype(np.float32)
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6), ref_ops.rms_norm(x, w, 1e-6), rtol=2e-6, atol=1e-6)


ROPES = [dict(), dict(neox=True), dict(n_rot=32), dict(neox=True, n_rot=48, base=1e6, freq_scale=0.25),
         dict(freq_factors=True, mscale=1.3)]


@pytest.mark.parametrize("kw", ROPES)
def test_rope_and_norm_rope(ops, ref_ops, kw):
    rng = np.random.default_rng(12)
    kw = dict(kw)
    hd = 64
    if kw.pop("freq_factors", False):
        kw["freq_factors"] = rng.uniform(1, 8, hd // 2).astype(np.float32)
    x = rng.standard_normal((6, 3, hd)).astype(np.float32)
    for pos in ([0, 1, 2, 3, 4, 5], [7, 300, 4000, 5, 5, 12]):
        want = ref_ops.rope(x, ref_ops.positions(pos), **kw)
        got = ops.rope(x, ops.positions(pos), **kw)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
        y = x.copy()
        assert ops.rope(y, ops.positions(pos), inplace=True, **kw) is y
        np.testing.assert_array_equal(y, got)
        w = rng.standard_normal(hd).astype(np.float32)
        a, b = x.copy(), x.copy()
        ref_ops.rms_norm_rope(a, w, 1e-6, ref_ops.positions(pos), **kw)
        ops.rms_norm_rope(b, w, 1e-6, ops.positions(pos), **kw)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def _cache_pair(ops, Hkv, n_slots, hdk, hdv, dtype):
    return ops.empty((Hkv, n_slots, hdk), dtype), ops.empty((Hkv, n_slots, hdv), dtype)


ATTN = [
    dict(N=1, Hq=4, Hkv=2, start=9),                       # decode, GQA
    dict(N=7, Hq=6, Hkv=2, start=0),                       # prefill
    dict(N=5, Hq=4, Hkv=4, start=11, window=4),            # sliding window
    dict(N=3, Hq=2, Hkv=1, start=4, softcap=5.0),
    dict(N=4, Hq=4, Hkv=2, start=6, masked=True),          # explicit mask (system1)
    dict(N=2, Hq=2, Hkv=1, start=3, hdv=40),               # head dims of K and V differ
]


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", ATTN)
def test_kv_store_and_attention(ref_ops, case, kv_dtype):
    ops = cpu_ops.CpuOps(kv_dtype=kv_dtype)
    rng = np.random.default_rng(13)
    N, Hq, Hkv, start = case["N"], case["Hq"], case["Hkv"], case["start"]
    hdk, hdv = 32, case.get("hdv", 32)
    n_slots = 32
    kc, vc = _cache_pair(ops, Hkv, n_slots, hdk, hdv, ops.kv_dtype)
    # history and the batch, both stored through kv_store
    hist_k = rng.standard_normal((start, Hkv, hdk)).astype(np.float32)
    hist_v = rng.standard_normal((start, Hkv, hdv)).astype(np.float32)
    k = rng.standard_normal((N, Hkv, hdk)).astype(np.float32)
    v = rng.standard_normal((N, Hkv, hdv)).astype(np.float32)
    q = rng.standard_normal((N, Hq, hdk)).astype(np.float32)
    if start:
        ops.kv_store(kc, vc, hist_k, hist_v, ops.positions(range(start)))
    slots = ops.positions(range(start, start + N))
    ops.kv_store(kc, vc, k, v, slots)
    n_kv = start + N
    allk = np.concatenate([hist_k, k]).transpose(1, 0, 2)
    allv = np.concatenate([hist_v, v]).transpose(1, 0, 2)
    tol = 1e-5 if kv_dtype == "float32" else 2e-3
    np.testing.assert_allclose(kc[:, :n_kv].astype(np.float32), allk, rtol=tol, atol=tol)
    np.testing.assert_allclose(vc[:, :n_kv].astype(np.float32), allv, rtol=tol, atol=tol)
    # the oracle on the same cache contents, as float32
    rk = kc[:, :n_kv].astype(np.float32)
    rv = vc[:, :n_kv].astype(np.float32)
    kw = dict(scale=0.17, softcap=case.get("softcap", 0.0))
    if case.get("masked"):
        allowed = rng.random((N, n_kv)) < 0.6
        allowed[0] = False  # a query that sees nothing gets zeros
        from reflex_ipc.runtime.batch import attention_mask

        kw.update(causal=False, mask=attention_mask(allowed, np.arange(N), np.arange(n_kv)))
    else:
        kw.update(causal=True, window=case.get("window", 0))
    got = ops.attention(q, kc, vc, slots, n_kv, **kw)
    want = _ref_attention(ref_ops, q, rk, rv, slots, n_kv, **kw)
    assert got.shape == (N, Hq, hdv)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if case.get("masked"):
        assert not got[0].any()


@pytest.mark.parametrize("case", [dict(Hq=8, Hkv=2), dict(Hq=4, Hkv=4, window=5), dict(Hq=6, Hkv=1, softcap=4.0),
                                  dict(Hq=4, Hkv=2, masked=True), dict(Hq=8, Hkv=2, sinks=True),
                                  dict(Hq=4, Hkv=4, chunk=4), dict(Hq=6, Hkv=2, sinks=True, chunk=5)])
def test_attention_blocks_match_single_queries(case):
    """A prompt pass attends in blocks of queries (x86: register tiles over several queries and
    heads); each query's result is the one it gets alone, within float rounding (the dots and
    the value sums are computed in the same order; the softmax's exponentials are vectorized)."""
    ops = cpu_ops.CpuOps(kv_dtype="float16")
    rng = np.random.default_rng(21)
    N, Hq, Hkv, hd, start = 11, case["Hq"], case["Hkv"], 40, 6
    kc, vc = _cache_pair(ops, Hkv, 32, hd, hd, ops.kv_dtype)
    ops.kv_store(kc, vc, rng.standard_normal((start + N, Hkv, hd)).astype(np.float32),
                 rng.standard_normal((start + N, Hkv, hd)).astype(np.float32), ops.positions(range(start + N)))
    q = rng.standard_normal((N, Hq, hd)).astype(np.float32)
    n_kv, slots = start + N, ops.positions(range(start, start + N))
    kw = dict(scale=0.2, softcap=case.get("softcap", 0.0))
    mask = None
    if case.get("masked"):
        from reflex_ipc.runtime.batch import attention_mask

        allowed = rng.random((N, n_kv)) < 0.5
        allowed[:, 2:4] = False  # keys no query sees
        allowed[3] = False  # a query that sees nothing
        mask = attention_mask(allowed, np.arange(N), np.arange(n_kv))
        kw.update(causal=False, mask=mask)
    else:
        kw.update(causal=True, window=case.get("window", 0))
    if case.get("sinks"):  # gpt-oss: a per-head logit in each softmax's denominator
        kw.update(sinks=rng.standard_normal(Hq).astype(np.float32))
    if case.get("chunk"):  # Llama 4: keys from the query's chunk start
        kw.update(chunk=case["chunk"])
    full = ops.attention(q, kc, vc, slots, n_kv, **kw)
    # the blocks and the single queries (with Hq > Hkv both take the block path) against the oracle
    want = _ref_attention(NumpyOps(), q, kc[:, :n_kv].astype(np.float32), vc[:, :n_kv].astype(np.float32),
                          slots, n_kv, **kw)
    np.testing.assert_allclose(full, want, rtol=1e-4, atol=1e-5)
    for n in range(N):
        one = dict(kw, mask=mask[n:n + 1]) if mask is not None else kw
        np.testing.assert_allclose(full[n], ops.attention(q[n:n + 1], kc, vc, slots[n:n + 1], n_kv, **one)[0],
                                   rtol=1e-5, atol=1e-6)
    if mask is not None:
        assert not full[3].any()


def _ref_attention(ref_ops, q, k, v, pos, n_kv, **kw):
    """NumpyOps.attention on the same contents (head sizes of K and V padded with zeros to one
    size: unchanged dots and sums)."""
    H = max(k.shape[2], v.shape[2])
    pad = lambda a: np.concatenate([a, np.zeros(a.shape[:-1] + (H - a.shape[-1],), np.float32)], axis=-1)
    return ref_ops.attention(pad(q), pad(k), pad(v), pos, n_kv, **kw)[..., :v.shape[2]]


def test_attention_errors(ops):
    kc, vc = _cache_pair(ops, 2, 16, 32, 32, ops.kv_dtype)
    q = np.zeros((1, 3, 32), np.float32)
    with pytest.raises(ValueError):
        ops.attention(q, kc, vc, [0], 1, scale=1.0)  # 3 query heads over 2 KV heads
    with pytest.raises(ValueError):
        ops.kv_store(kc, vc, np.zeros((1, 2, 32), np.float32), np.zeros((1, 2, 32), np.float32), [16])


def test_selection_and_memory(ops, ref_ops):
    rng = np.random.default_rng(14)
    logits = rng.standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_array_equal(ops.argmax(logits), ref_ops.argmax(logits))
    out = ops.empty((3,), "int32")
    assert ops.argmax(logits, out=out) is out
    np.testing.assert_array_equal(out, ref_ops.argmax(logits))
    np.testing.assert_allclose(ops.logprobs(logits, [0, 2, 2], [4, 5, 49], n=50),
                               ref_ops.logprobs(logits, [0, 2, 2], [4, 5, 49], n=50))
    dst = ops.empty((2, 3))
    ops.write(dst, np.arange(6).reshape(2, 3))
    c = ops.empty((2, 3))
    ops.copy(dst, c)
    np.testing.assert_array_equal(ops.to_numpy(c), np.arange(6).reshape(2, 3))
    assert ops.empty(4, "float16").dtype == np.float16
    z = ops.zeros((2, 3), "float16")
    assert z.dtype == np.float16 and not z.any()
    assert ops.positions(range(3)).dtype == np.int32


# --- graphs ----------------------------------------------------------------------------------
def test_captured_step_replays(ops):
    rng = np.random.default_rng(15)
    raw, _ = random_weight("Q4_1", 64, 128, rng)
    w = load(ops, "Q4_1", raw, 64, 128)
    emb_raw, _ = random_weight("Q8_0", 10, 128, rng)
    emb = load(ops, "Q8_0", emb_raw, 10, 128)
    norm = rng.standard_normal(128).astype(np.float32)
    kc, vc = _cache_pair(ops, 2, 8, 32, 32, ops.kv_dtype)
    ids, pos = ops.empty((1,), "int32"), ops.empty((1,), "int32")
    next_id = ops.empty((1,), "int32")

    def step():
        x = ops.embed(emb, ids, scale=1.5)
        h = ops.rms_norm(x, norm, 1e-5)
        y = ops.matmul(h, w).reshape(1, 2, 32)
        ops.rope(y, pos, inplace=True)
        ops.kv_store(kc, vc, y, y, pos)
        a = ops.attention(y, kc, vc, pos, 8, scale=0.2).reshape(1, 64)
        out = ops.add(ops.silu(a), ops.softcap(ops.scale(a, 0.5), 3.0))
        ops.argmax(out, out=next_id)
        return out

    ops.write(ids, [3])
    ops.write(pos, [0])
    graph, first = ops.capture(step)
    for p in range(1, 6):
        ops.write(ids, [p])
        ops.write(pos, [p])
        graph.launch()
        replayed, replayed_id = first.copy(), int(next_id[0])
        np.testing.assert_array_equal(replayed, step())  # eager again (rewrites slot p identically)
        assert replayed_id == int(np.argmax(replayed))
    ops.write(ids, [10])  # out of the embedding's range: the replay says so
    with pytest.raises(ValueError):
        graph.launch()
    graph.close()
    # a step with a numpy fallback cannot be recorded: its graph runs it again at each launch
    x = ops.empty((1, 128))
    ops.write(x, np.ones((1, 128)))
    g2, res = ops.capture(lambda: ops.add(x[:, ::2], x[:, ::2]))
    assert isinstance(g2, cpu_ops.EagerGraph)
    ops.write(x, np.full((1, 128), 3.0))
    g2.launch()
    np.testing.assert_array_equal(res, np.full((1, 64), 6.0))


# --- the library missing -------------------------------------------------------------------
def test_missing_library_falls_back_to_numpy_with_one_warning(tmp_path):
    code = ("from reflex_ipc.backends import cpu_ops\n"
            "cpu_ops.library_path = lambda: '/nonexistent/libreflex_cpu.so'\n"
            "from reflex_ipc.engine import make_backend\n"
            "a = make_backend('cpu'); b = make_backend('cpu')\n"
            "print(a.name, b.name)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["numpy", "numpy"]
    assert r.stderr.count("warning") == 1 and "nonexistent" in r.stderr


def test_device_names():
    from reflex_ipc.engine import make_backend

    assert make_backend("cpu").name == "cpu"
    assert make_backend("numpy").name == "numpy"


# --- models ----------------------------------------------------------------------------------
# Measured (tests/data synthetic models and SmolLM2 Q4_1, the prompts below): the cpu
# backend's logits differ from the numpy oracle's by at most ~1-3% of max|logit| (int8
# activation rounding and the float16 KV cache; llama.cpp on the same files is 2-4% away
# from exact arithmetic, tests/arch/test_goldens.py). Bounds: 5% of max|logit| for the logits,
# greedy divergence only at a near tie of the oracle (< 2% of max|logit|), and the mean
# |log-prob difference| of the oracle's greedy tokens under 0.15 nats.
MODEL_LOGIT_TOL = 0.05
MODEL_TIE = 0.02
MODEL_LOGPROB_TOL = 0.15
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time"]


def _models():
    out = [os.path.join(ROOT, "tests", "data", f) for f in sorted(os.listdir(os.path.join(ROOT, "tests", "data")))
           if f.endswith(".gguf")]
    from reflex_ipc.modelpath import resolve_model

    out.append(resolve_model(None))  # SmolLM2
    return out


@pytest.fixture(scope="module")
def runners():
    from reflex_ipc.engine import load_runner

    cache = {}

    def get(path, device):
        if (path, device) not in cache:
            cache[path, device] = load_runner(path, device=device, n_ctx=512)
        return cache[path, device]

    yield get
    for r in cache.values():
        r.close()


def _log_softmax(z):
    z = z.astype(np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


@pytest.mark.parametrize("path", _models(), ids=os.path.basename)
def test_model_matches_numpy(runners, path):
    cpu, ref = runners(path, "cpu"), runners(path, "numpy")
    assert cpu.ops.name == "cpu" and ref.ops.name == "numpy"
    for prompt in PROMPTS:
        ids = ref.tok.encode(prompt)  # as generate tokenizes (the model's add_bos)
        a, b = cpu.prompt_logits(ids), ref.prompt_logits(ids)
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err <= MODEL_LOGIT_TOL, f"{prompt!r}: logits {err:.3g} of max|logit| from numpy's"
        got = cpu.generate(prompt, max_tokens=16, temperature=0.0)
        want = ref.generate(prompt, max_tokens=16, temperature=0.0)
        g, w = got["token_ids"], want["token_ids"]
        k = next((i for i in range(min(len(g), len(w))) if g[i] != w[i]), None)
        if k is None and len(g) != len(w):  # one of them ended (end of generation) first
            shorter = got if len(g) < len(w) else want
            assert shorter["finish_reason"] == "stop", (got, want)
        if k is not None:  # the first divergence must be a near tie of the oracle
            prefix = ids + w[:k]
            z = ref.prompt_logits(prefix)
            gap = float(z[w[k]] - z[g[k]])
            assert gap <= MODEL_TIE * np.abs(z).max(), (
                f"{prompt!r}: step {k}: ours {g[k]}, numpy {w[k]}, gap {gap:.4g} of max|logit| "
                f"{np.abs(z).max():.4g}")
        # log-probs of the oracle's greedy tokens under both backends (teacher forcing)
        seq = ids + w
        diffs = []
        for j in range(len(w)):
            za, zb = cpu.prompt_logits(seq[:len(seq) - len(w) + j]), ref.prompt_logits(seq[:len(seq) - len(w) + j])
            diffs.append(abs(_log_softmax(za)[w[j]] - _log_softmax(zb)[w[j]]))
            if j >= 4:
                break
        assert np.mean(diffs) <= MODEL_LOGPROB_TOL, f"{prompt!r}: log-prob differences {diffs}"


def _isa_model(isa, path):
    code = (
        "import sys, json\n"
        "from reflex_ipc.engine import load_runner\n"
        f"r = load_runner({path!r}, device='cpu', n_ctx=256)\n"
        "out = {'isa': r.ops.isa, 'logits': [], 'gen': []}\n"
        f"for p in {PROMPTS[:2]!r}:\n"
        "    out['logits'].append(r.prompt_logits(r.tok.encode(p)).tolist())\n"
        "    out['gen'].append(r.generate(p, max_tokens=6, temperature=0.0)['token_ids'])\n"
        "print(json.dumps(out))\n")
    env = dict(os.environ, REFLEX_CPU_ISA=isa, REFLEX_CPU_THREADS="2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=1800)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", [p for p in _models() if "synthetic-" in p][:2], ids=os.path.basename)
def test_model_identical_on_every_code_path(path):
    """A whole model (prompt logits, greedy tokens) on each code path against the portable C
    one: bit-identical on aarch64 (neon.c keeps generic.c's order of float sums), within float
    rounding of the sums' order on x86."""
    import platform

    base = _isa_model("generic", path)
    assert base["isa"] == "generic"
    arm = platform.machine().lower() in ("aarch64", "arm64")
    for isa in ("neon", "auto") if arm else ("avx2", "auto"):
        res = _isa_model(isa, path)
        if arm:
            assert res["logits"] == base["logits"] and res["gen"] == base["gen"], f"{res['isa']}"
            continue
        for a, b in zip(res["logits"], base["logits"]):
            a, b = np.asarray(a), np.asarray(b)
            assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max(), res["isa"]


# --- the build -----------------------------------------------------------------------------
def _cpu_build():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reflex_cpu_build", os.path.join(ROOT, "kernels", "cpu", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_produces_a_loadable_library(tmp_path):
    import ctypes

    info = _cpu_build().build(str(tmp_path), force=True)
    assert info["built"], info.get("reason")
    from reflex_ipc.backends.cpu_launch import ABI_VERSION

    lib = ctypes.CDLL(str(tmp_path / "libreflex_cpu.so"))
    assert lib.rx_abi_version() == ABI_VERSION
    assert json.loads((tmp_path / "cpu_build.json").read_text())["built"] is True


def test_build_without_a_compiler_warns_and_records_why(tmp_path, monkeypatch, capsys):
    build = _cpu_build()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(build, "find_cc", lambda: None)
    info = build.build(str(tmp_path), force=True)
    assert not info["built"] and "compiler" in info["reason"]
    assert not (tmp_path / "libreflex_cpu.so").exists()
    assert "warning" in capsys.readouterr().err
    monkeypatch.setenv("REFLEX_CPU_BUILD", "strict")
    with pytest.raises(SystemExit):
        build.build(str(tmp_path), force=True)


@pytest.mark.parametrize("path", _models()[:-1], ids=os.path.basename)  # the synthetic models
def test_system1_and_embed_match_numpy(runners, path):
    """system1 (one masked pass; repeated, so that the runtime captures and replays it) and
    embed on the cpu backend against numpy: log-probabilities within MODEL_LOGPROB_TOL per
    token, the same best candidate unless the oracle's top two are within that bound."""
    cpu, ref = runners(path, "cpu"), runners(path, "numpy")
    prompt, cands = "The weather today is", [" sunny", " rainy and cold", " 42", " sunny"]
    want = ref.system1(prompt, cands, cache_prompt=False)
    lw = [c["logprob"] for c in want["candidates"]]
    for rep in range(4):
        got = cpu.system1(prompt, cands, cache_prompt=rep % 2 == 0)
        for g, w in zip(got["candidates"], want["candidates"]):
            assert g["token_ids"] == w["token_ids"]
            assert abs(g["logprob"] - w["logprob"]) <= MODEL_LOGPROB_TOL * max(1, len(w["token_ids"])), (rep, g, w)
        if got["best_idx"] != want["best_idx"]:
            assert abs(lw[got["best_idx"]] - lw[want["best_idx"]]) <= MODEL_LOGPROB_TOL * 4
    a = cpu.embed(["hello world", "a b c d e f"], normalize=True)
    b = ref.embed(["hello world", "a b c d e f"], normalize=True)
    for x, y in zip(a["embeddings"], b["embeddings"]):
        assert float(np.dot(x, y)) >= 0.99  # cosine of unit vectors


def test_capture_reuses_dead_intermediates(ops):
    x = ops.empty((1, 1024))
    ops.write(x, np.ones((1, 1024)))

    def chain():
        y = x
        for _ in range(10):
            y = ops.scale(y, 1.5)
        return y

    graph, out = ops.capture(chain)
    assert len(graph.keep) <= 3  # ten results, at most three buffers alive at a time
    ops.write(x, np.full((1, 1024), 2.0))
    graph.launch()
    np.testing.assert_allclose(out, 2.0 * 1.5 ** 10, rtol=1e-6)
