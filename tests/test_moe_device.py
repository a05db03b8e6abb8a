"""The CUDA backend's mixture of experts without a GPU: a numpy model of the routing kernel
(kernels/moe.cuh moe_route_f32: its thread-strided scans, its warp reductions, its group scan)
against base.moe_route, and CudaOps.moe run on a fake runtime whose device memory is a numpy
byte array and whose MoE kernels are interpreted in numpy at launch, against NumpyOps.moe
(the launch arguments, pointer offsets, grids; that no host copy happens). The kernels'
arithmetic on a GPU is checked by reflex_ipc.testing.opchecks.check_moe (scripts/gpu/gpu-check)."""

import numpy as np
import pytest

from reflex_ipc.backends.base import fusion_on, moe_route
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing.moe_runtime import MemRuntime, kernel_route

F32 = np.float32

ROUTE_CASES = [  # E, k, gating, bias, groups, norm, scale, ties
    (8, 2, "softmax", False, None, True, 1.0, False), (128, 8, "softmax", False, None, True, 1.0, False),
    (128, 8, "sigmoid", True, (8, 4), True, 2.5, False), (64, 6, "softmax", False, (8, 3), False, 16.0, False),
    (8, 8, "sigmoid", False, None, False, 1.0, False), (300, 8, "sigmoid", True, (10, 4), True, 2.5, False),
    (8, 2, "softmax", False, None, True, 1.0, True), (128, 8, "softmax", False, None, True, 1.0, True),
    (128, 8, "sigmoid", False, (8, 4), True, 1.0, True), (64, 6, "softmax", False, (16, 3), False, 1.0, True),
    (32, 1, "sigmoid", False, None, False, 1.0, True), (8, 3, "sigmoid", False, (8, 5), True, 1.0, True),
    (16, 6, "softmax", False, (4, 1), True, 1.0, False),  # fewer kept experts than k: -inf, lower index first
    (600, 4, "softmax", False, None, True, 1.0, True),
]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=[str(c) for c in ROUTE_CASES])
def test_routing_kernel_model_equals_moe_route(case):
    E, k, gating, has_bias, groups, norm, scale, ties = case
    rng = np.random.default_rng(E * 31 + k)
    N = 5
    lg = (rng.integers(0, 4, (N, E)) * 0.5).astype(F32) if ties else (rng.standard_normal((N, E)) * 2).astype(F32)
    bias = (rng.integers(0, 3, E) * 1.0).astype(F32) if has_bias else None
    top, w = moe_route(lg, k, gating, norm, scale, bias, groups)
    G, G_used = groups if groups else (0, 0)
    for n in range(N):
        ids, wk = kernel_route(lg[n], k, 0 if gating == "softmax" else 1, norm, scale, bias, G, G_used)
        assert ids.tolist() == top[n].tolist()
        np.testing.assert_allclose(wk, w[n], rtol=2e-6, atol=1e-7)


# -- CudaOps.moe on a fake runtime with numpy device memory (reflex_ipc.testing.moe_runtime) --
@pytest.fixture
def mem_ops():
    from reflex_ipc.backends import cuda_ops

    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    rt = MemRuntime()
    ops.rt, ops.pool, ops.k = rt, rt.pool, rt.kernel
    ops._arenas, ops._extra_weights, ops._graph = {}, [], None
    ops.mma, ops._seq_memo = False, None  # the per-row matmul kernels (what the interpreter runs)
    return ops


MOE_CASES = {  # name: (E, k, fused gate_up, types (gate, up, down), moe keyword arguments)
    "softmax": (8, 2, False, (0, 0, 0), {}),
    "sigmoid bias groups scale": (16, 4, False, (0, 0, 1), dict(gating="sigmoid", bias=True, groups=(4, 2),
                                                                   scale=2.5)),
    "no norm k=1": (8, 1, False, (1, 1, 0), dict(norm=False, scale=16.0)),
    "fused gelu logits expert_scale": (8, 3, True, (0, None, 0), dict(act="gelu", logits=True, escale=True)),
    "gate/up of two formats": (8, 2, False, (0, 1, 0), {}),
    "gate/up of two formats gelu": (8, 2, False, (1, 0, 1), dict(act="gelu")),
    "f16": (8, 2, False, (1, 1, 1), {}),
    "f16 sigmoid bias groups scale": (16, 4, False, (1, 1, 1), dict(gating="sigmoid", bias=True, groups=(4, 2),
                                                                       scale=2.5)),
    "f16 fused gelu logits expert_scale": (8, 3, True, (1, None, 1), dict(act="gelu", logits=True, escale=True)),
}


@pytest.mark.parametrize("name", sorted(MOE_CASES))
@pytest.mark.parametrize("N", [1, 3])
def test_cuda_moe_on_interpreted_kernels_equals_numpy(mem_ops, name, N):
    ops, rt = mem_ops, mem_ops.rt
    E, k, fused, (tg, tu, td), o = MOE_CASES[name]
    rng = np.random.default_rng(len(name) * 7 + N)
    K, F, D = 16, 8, 12
    q = (lambda a, t: a if t == 0 else a.astype(np.float16).astype(F32))  # what the device holds
    gate = q((rng.standard_normal((E * F * (2 if fused else 1), K)) * 0.3).astype(F32), tg)
    up = None if fused else q((rng.standard_normal((E * F, K)) * 0.3).astype(F32), tu)
    down = q((rng.standard_normal((E * D, F)) * 0.3).astype(F32), td)
    router = (rng.standard_normal((E, K)) * 0.5).astype(F32)
    x = rng.standard_normal((N, K)).astype(F32)
    lg = (rng.standard_normal((N, E)) * 2).astype(F32) if o.get("logits") else None
    bias = (rng.integers(0, 3, E) * 1.0).astype(F32) if o.get("bias") else None
    escale = rng.uniform(0.5, 2, E).astype(F32) if o.get("escale") else None
    kw = dict(gating=o.get("gating", "softmax"), norm=o.get("norm", True), scale=o.get("scale", 1.0),
              act=o.get("act", "silu"), groups=o.get("groups"))
    want = NumpyOps().moe(x, router, gate, up, down, k, selection_bias=bias, logits=lg, expert_scale=escale, **kw)
    before_copies = rt.top
    got = ops.moe(ops.asarray(x), rt.weight(router), rt.weight(gate, tg), None if fused else rt.weight(up, tu),
                  rt.weight(down, td), k, selection_bias=None if bias is None else ops.asarray(bias),
                  logits=None if lg is None else ops.asarray(lg),
                  expert_scale=None if escale is None else ops.asarray(escale), **kw)
    assert before_copies  # (no device -> host copy exists on this runtime: moe needs none)
    assert got.shape == (N, D) and got.dtype == "float32"
    np.testing.assert_allclose(rt.f32(got.ptr, N * D).reshape(N, D), want, rtol=1e-5, atol=1e-5)
    names = [launch[0] for launch in rt.launches]
    kind = {0: "f32", 1: "f16"}
    glu = ([f"moe_glu_{kind[tg]}"] if fused or tg == tu else
           [f"moe_mm_{kind[tg]}", f"moe_mm_{kind[tu]}", "swiglu_f32" if kw["act"] == "silu" else "geglu_f32"])
    # the router: one token's matvec of few rows runs a block per row (mmsk1) when fusion is on
    router = "mm4_f32" if N > 1 else ("mmsk1_f32" if fusion_on() else "mm1_f32")
    assert names == ([] if lg is not None else [router]) + ["moe_route_f32"] + glu + \
        [f"moe_down_{kind[td]}"]


@pytest.mark.parametrize("name", sorted(MOE_CASES))
def test_cuda_moe_grouped_on_interpreted_kernels_equals_numpy(mem_ops, name):
    """The tensor-core prefill form (CudaOps.moe_mma, N >= moe_mma_min_n): the grouping, the
    grouped gate/up and down GEMMs and the weighted sum launched with the right arguments (their
    rounding of x and of H to f16 included), against numpy; gate/up of two formats keep the
    per-pair kernels."""
    ops, rt = mem_ops, mem_ops.rt
    ops.moe_mma, ops.moe_mma_min_n, ops._sms = True, 2, 132
    E, k, fused, (tg, tu, td), o = MOE_CASES[name]
    N, K, F, D = 70, 16, 8, 12
    rng = np.random.default_rng(len(name) * 5 + 1)
    q = (lambda a, t: a if t == 0 else a.astype(np.float16).astype(F32))
    gate = q((rng.standard_normal((E * F * (2 if fused else 1), K)) * 0.3).astype(F32), tg)
    up = None if fused else q((rng.standard_normal((E * F, K)) * 0.3).astype(F32), tu)
    down = q((rng.standard_normal((E * D, F)) * 0.3).astype(F32), td)
    router = (rng.standard_normal((E, K)) * 0.5).astype(F32)
    x = rng.standard_normal((N, K)).astype(F32)
    lg = (rng.standard_normal((N, E)) * 2).astype(F32) if o.get("logits") else None
    bias = (rng.integers(0, 3, E) * 1.0).astype(F32) if o.get("bias") else None
    escale = rng.uniform(0.5, 2, E).astype(F32) if o.get("escale") else None
    kw = dict(gating=o.get("gating", "softmax"), norm=o.get("norm", True), scale=o.get("scale", 1.0),
              act=o.get("act", "silu"), groups=o.get("groups"))
    mma_types = {1}  # F16 takes the tensor cores, F32 does not
    grouped = (fused or tg == tu) and tg in mma_types and td in mma_types
    if lg is None:
        lg = x @ router.T  # the router's logits as given: the interpreter's mm4 is float32 already
    want = NumpyOps().moe(x.astype(np.float16).astype(F32) if grouped else x, router, gate, up, down, k,
                          selection_bias=bias, logits=lg, expert_scale=escale, **kw)
    got = ops.moe(ops.asarray(x), rt.weight(router), rt.weight(gate, tg), None if fused else rt.weight(up, tu),
                  rt.weight(down, td), k, selection_bias=None if bias is None else ops.asarray(bias),
                  logits=ops.asarray(lg), expert_scale=None if escale is None else ops.asarray(escale), **kw)
    names = [launch[0] for launch in rt.launches]
    tol = 2e-3 if grouped else 1e-5  # H rounded to f16 between the two GEMMs
    np.testing.assert_allclose(rt.f32(got.ptr, N * D).reshape(N, D), want, rtol=tol, atol=tol)
    if grouped:
        assert names == ["moe_route_f32", "moe_group_i32", "mma_x_f16", "mmaglu_moe_f16", "mma_moe_f16",
                         "moe_wsum_f32"], names
        tmax = N * k // 64 + min(E, N * k)
        assert all(launch[1][1] == tmax for launch in rt.launches if "_moe_" in launch[0])
        assert ops.moe_mma_launches == 1
    else:
        assert "moe_group_i32" not in names and ops.moe_mma_launches == 0


@pytest.mark.parametrize("name", ["softmax", "fused gelu logits expert_scale", "gate/up of two formats"])
def test_cuda_moe_down_split_launches_and_equals_numpy(mem_ops, name):
    """CudaOps.moe_down_split: the down projection as moe_mm (a warp per pair and row, x_div 1)
    and moe_wsum_f32 in place of moe_down, equal to numpy."""
    ops, rt = mem_ops, mem_ops.rt
    ops.moe_down_split = True
    E, k, fused, (tg, tu, td), o = MOE_CASES[name]
    rng = np.random.default_rng(len(name))
    N, K, F, D = 2, 16, 8, 12
    gate = (rng.standard_normal((E * F * (2 if fused else 1), K)) * 0.3).astype(F32)
    up = None if fused else (rng.standard_normal((E * F, K)) * 0.3).astype(np.float16).astype(F32)
    down = (rng.standard_normal((E * D, F)) * 0.3).astype(F32)
    router = (rng.standard_normal((E, K)) * 0.5).astype(F32)
    x = rng.standard_normal((N, K)).astype(F32)
    lg = (rng.standard_normal((N, E)) * 2).astype(F32)
    escale = rng.uniform(0.5, 2, E).astype(F32) if o.get("escale") else None
    kw = dict(act=o.get("act", "silu"))
    want = NumpyOps().moe(x, router, gate, up, down, k, logits=lg, expert_scale=escale, **kw)
    got = ops.moe(ops.asarray(x), rt.weight(router), rt.weight(gate, 0), None if fused else rt.weight(up, tu),
                  rt.weight(down, 0), k, logits=ops.asarray(lg),
                  expert_scale=None if escale is None else ops.asarray(escale), **kw)
    np.testing.assert_allclose(rt.f32(got.ptr, N * D).reshape(N, D), want, rtol=1e-5, atol=1e-5)
    names = [launch[0] for launch in rt.launches]
    assert names[-2:] == ["moe_mm_f32", "moe_wsum_f32"] and not any(n.startswith("moe_down") for n in names)


def test_cuda_moe_checks_its_arguments(mem_ops):
    ops, rt = mem_ops, mem_ops.rt
    x = ops.asarray(np.zeros((2, 16), F32))
    router, gate, down = rt.weight(np.zeros((8, 16))), rt.weight(np.zeros((64, 16))), rt.weight(np.zeros((96, 8)))
    with pytest.raises(ValueError):  # gate of 8 experts x 8 rows, up of another size
        ops.moe(x, router, gate, rt.weight(np.zeros((32, 16))), down, 2)
    with pytest.raises(ValueError):
        ops.moe(x, router, gate, gate, down, 9)  # more experts used than there are
    with pytest.raises(ValueError):
        ops.moe(x, router, gate, gate, down, 2, gating="relu")
    with pytest.raises(ValueError):
        ops.moe(x, router, gate, gate, down, 2, groups=(3, 1))  # 8 experts in 3 groups
    with pytest.raises(ValueError):
        ops.moe(x, router, gate, gate, down, 2, act="relu")
    assert not any(n.startswith("moe_glu") for n, *_ in rt.launches)


def test_host_mode_is_not_captured(monkeypatch):
    """REFLEX_CUDA_MOE=host: the host-routed path, and MoE models then say they cannot be captured."""
    from types import SimpleNamespace

    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.models.qwen3moe import Model

    monkeypatch.setattr(cuda_ops, "_cuda_runtime", lambda: SimpleNamespace(pool=None, kernel=None, cc=(9, 0)))
    monkeypatch.setenv("REFLEX_CUDA_MOE", "host")
    ops = cuda_ops.CudaOps()
    assert ops._moe_host_mode and not ops.moe_capturable
    m = Model.__new__(Model)
    m.ops = ops
    assert m.capturable is False
    monkeypatch.delenv("REFLEX_CUDA_MOE")
    m.ops = cuda_ops.CudaOps()
    assert m.capturable is True
    m.ops = NumpyOps()  # a backend whose moe is not known to be capturable
    assert m.capturable is False


def test_qwen3moe_forward_launches_moe_kernels_without_host_sync(monkeypatch, tmp_path):
    """A qwen3moe forward pass on CudaOps (kernels recorded, not run): every layer's experts go
    through the device routing and expert kernels, and nothing waits for the device (this
    runtime has no device -> host copy), so the model may be captured."""
    import os

    from reflex_ipc.backends import cuda_ops
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.models import load_model
    from reflex_ipc.runtime.batch import Batch
    from reflex_ipc.testing.synthetic import example_gguf, examples

    class Arena:
        def __init__(self, rt, f):
            self.start = f.data_offset

        def ptr(self, info):
            return (1 << 30) + info.offset - self.start

        def wait(self):
            pass

        queue = None  # (not streaming)

        def streaming(self):
            return False

    monkeypatch.setattr(cuda_ops, "WeightArena", Arena)
    ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
    rt = MemRuntime(nbytes=8 << 20, interpret=False)
    ops.rt, ops.pool, ops.k = rt, rt.pool, rt.kernel
    ops._arenas, ops._extra_weights, ops._graph = {}, [], None
    ops.mma, ops._seq_memo = False, None  # the per-row matmul kernels (what the interpreter runs)
    keys = examples()["qwen3moe"][1]["keys"]
    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "synthetic-llama.gguf")
    path = example_gguf("qwen3moe", str(tmp_path / "qwen3moe.gguf"), tokenizer=tok, qtype="Q8_0")
    with GGUFFile(path) as f:
        model = load_model(ops, f)
        assert model.capturable
        state = model.new_state(ops, 64)
        for ids in ([5], [5, 6, 7]):
            rt.launches.clear()
            model.forward(state, Batch(ops, ids, list(range(len(ids)))))
            names = [launch[0] for launch in rt.launches]
            for kern in ("moe_route_f32", "moe_glu_", "moe_down_"):
                assert sum(n.startswith(kern) for n in names) == keys["block_count"], (kern, names)
            route = next(launch for launch in rt.launches if launch[0] == "moe_route_f32")
            assert route[1] == (len(ids), 1, 1) and route[3][5:7] == (keys["expert_count"], keys["expert_used_count"])


ARCH_CASES = {  # name: (E, k, moe keyword arguments, gpt-oss biases)
    "gpt-oss softmax_weight swiglu_oai biases": (8, 4, dict(gating="softmax_weight", norm=False, act="swiglu_oai"),
                                                 True),
    "gpt-oss swiglu_oai no biases": (8, 2, dict(gating="softmax_weight", norm=False, act="swiglu_oai"), False),
    "llama4 sigmoid weight_before k=1": (8, 1, dict(gating="sigmoid", norm=False, weight_before=True), False),
    "llama4 sigmoid weight_before k=2": (8, 2, dict(gating="sigmoid", norm=False, weight_before=True), False),
}


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("name", sorted(ARCH_CASES))
def test_cuda_moe_gpt_oss_llama4_forms_on_interpreted_kernels(mem_ops, name, grouped):
    """gpt-oss's MoE (router bias, softmax_weight, expert gate/up biases and the clamped SwiGLU,
    down biases) and Llama 4's (the weight applied to each pair's input) in both forms: per pair
    (moe_mm twice, moe_swiglu_oai_f32 / moe_weight_input_f32, moe_down) and grouped on tensor
    cores (mmaglu_moe's act 2 with the biases in its epilogue; x rows per pair, k = 1, for
    Llama 4), against numpy."""
    ops, rt = mem_ops, mem_ops.rt
    ops.moe_mma, ops.moe_mma_min_n, ops._sms = True, (2 if grouped else 10 ** 9), 132
    E, k, kw, biases = ARCH_CASES[name]
    N, K, F, D = (70 if grouped else 3), 16, 8, 12
    rng = np.random.default_rng(len(name) * 3 + grouped)
    h16 = (lambda a: a.astype(np.float16).astype(F32))
    gate = h16(rng.standard_normal((E * F, K)).astype(F32))  # gate values past the clamp of 7
    up = h16(rng.standard_normal((E * F, K)).astype(F32))
    down = h16((rng.standard_normal((E * D, F)) * 0.3).astype(F32))
    router = (rng.standard_normal((E, K)) * 0.5).astype(F32)
    x = (rng.standard_normal((N, K)) * 2).astype(F32)
    extra = {}
    if biases:
        extra = {"router_bias": rng.standard_normal(E) * 0.5, "gate_bias": rng.standard_normal((E, F)) * 2,
                 "up_bias": rng.standard_normal((E, F)) * 2, "down_bias": rng.standard_normal((E, D)) * 0.5}
        extra = {n: a.astype(F32) for n, a in extra.items()}
    lg = x @ router.T  # the router's logits as given (the interpreter's matmul is float32 already)
    if grouped:  # what the tensor cores read: x (Llama 4: x times the pair's weight) as f16
        ids, w = moe_route(lg + extra.get("router_bias", 0), k, kw["gating"], False, 1.0)
        if kw.get("weight_before"):
            xp = h16(np.repeat(x, k, 0) * w.reshape(-1, 1))
            want = np.zeros((N, D), F32)
            for p in range(N * k):
                e = ids.reshape(-1)[p]
                g, u = gate[e * F:(e + 1) * F] @ xp[p], up[e * F:(e + 1) * F] @ xp[p]
                want[p // k] += down[e * D:(e + 1) * D] @ h16(g / (1 + np.exp(-g)) * u)
        else:
            want = None
    xin = h16(x) if grouped else x
    if not (grouped and kw.get("weight_before")):
        want = NumpyOps().moe(xin, router, gate, up, down, k, logits=lg, **kw, **extra)
    got = ops.moe(ops.asarray(x), rt.weight(router), rt.weight(gate, 1), rt.weight(up, 1), rt.weight(down, 1), k,
                  logits=ops.asarray(lg), **kw, **{n: ops.asarray(a) for n, a in extra.items()})
    names = [launch[0] for launch in rt.launches]
    tol = 4e-3 if grouped else 1e-5  # H rounded to f16 between the two GEMMs
    np.testing.assert_allclose(rt.f32(got.ptr, N * D).reshape(N, D), want, rtol=tol, atol=tol * np.abs(want).max())
    pre = (["add_row_f32"] if biases else []) + ["moe_route_f32"] + \
        (["moe_weight_input_f32"] if kw.get("weight_before") else [])
    post = ["moe_down_bias_f32"] if biases else []
    if grouped:
        assert names == pre + ["moe_group_i32", "mma_x_f16", "mmaglu_moe_f16", "mma_moe_f16", "moe_wsum_f32"] + post
        glu = next(launch for launch in rt.launches if launch[0] == "mmaglu_moe_f16")[3]
        assert glu[14] == (2 if kw.get("act") == "swiglu_oai" else 0) and glu[11] == (1 if kw.get("weight_before") else k)
        assert glu[17] == 1  # MOE_SKIP; no MOE_WIDE for F16 (cuda_ops._moe_flags)
        assert ops.moe_mma_launches == 1
    else:
        mid = ["moe_mm_f16", "moe_mm_f16", "moe_swiglu_oai_f32"] if kw.get("act") == "swiglu_oai" else ["moe_glu_f16"]
        assert names == pre + mid + ["moe_down_f16"] + post
