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
from reflex_ipc.testing.moe_runtime import MemRuntime, kernel_route, kernel_route_warp

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
        if not G and E <= 256:  # moe_route_warp_f32: the same ids, weights within rounding
            ids, wk = kernel_route_warp(lg[n], k, 0 if gating == "softmax" else 1, norm, scale, bias)
            assert ids.tolist() == top[n].tolist()
            np.testing.assert_allclose(wk, w[n], rtol=2e-6, atol=1e-7)


def test_routing_warp_kernel_model_softmax_weight_and_nan():
    """moe_route_warp_f32's model: gpt-oss's softmax_weight (a softmax over the chosen logits),
    E of 1..256 (lanes holding 0..8 experts), and a NaN logit never chosen."""
    rng = np.random.default_rng(3)
    for E, k in ((1, 1), (33, 4), (128, 8), (256, 8), (200, 32)):
        lg = (rng.standard_normal(E) * 2).astype(F32)
        for gating, g in (("softmax", 0), ("sigmoid", 1), ("softmax_weight", 2)):
            top, w = moe_route(lg[None], k, gating, gating != "softmax_weight", 1.0)
            ids, wk = kernel_route_warp(lg, k, g, gating != "softmax_weight", 1.0)
            assert ids.tolist() == top[0].tolist()
            np.testing.assert_allclose(wk, w[0], rtol=2e-6, atol=1e-7)
    lg = (rng.standard_normal(64)).astype(F32)
    lg[3] = np.nan
    ids, _ = kernel_route_warp(lg, 8, 1, True, 1.0)
    assert 3 not in ids.tolist() and len(set(ids.tolist())) == 8


# -- CudaOps.moe on a fake runtime with numpy device memory (reflex_ipc.testing.moe_runtime) --
def route_name(E, groups):
    """The routing kernel CudaOps.moe_route launches: a warp per token up to 256 experts without groups."""
    return "moe_route_warp_f32" if E <= 256 and not (groups and groups[0] > 1) else "moe_route_f32"


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
    assert names == ([] if lg is not None else [router]) + [route_name(E, kw["groups"])] + glu + \
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
        assert names == [route_name(E, kw["groups"]), "moe_group_i32", "mma_x_f16", "mmaglu_moe_f16", "mma_moe_f16",
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


@pytest.mark.parametrize("matvec", [False, True])
def test_qwen3moe_forward_launches_moe_kernels_without_host_sync(monkeypatch, tmp_path, matvec):
    """A qwen3moe forward pass on CudaOps (kernels recorded, not run): every layer's experts go
    through the device routing and expert kernels (Q8_0: moe.cuh's, or with REFLEX_MATVEC=new
    moe_mv.cuh's), and nothing waits for the device (this runtime has no device -> host copy),
    so the model may be captured."""
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
    ops.matvec = matvec
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
            # (the example's experts are 24 wide: their down projection stays F32, on moe_down)
            for kern in ("moe_route_warp_f32",) + (("moe_mvgluc_q8_0", "moe_down_f32") if matvec else
                                                    ("moe_glu_", "moe_down_")):
                assert sum(n.startswith(kern) for n in names) == keys["block_count"], (kern, [n for n in names if "moe" in n])
            route = next(launch for launch in rt.launches if launch[0] == "moe_route_warp_f32")
            assert route[1] == (1, 1, 1) and route[3][5:8] == (len(ids), keys["expert_count"],
                                                               keys["expert_used_count"])


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
    pre = (["add_row_f32"] if biases else []) + ["moe_route_warp_f32"] + \
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


# -- decode on matvec.cuh's machinery (kernels/moe_mv.cuh), quantized experts ------------------
MV_FORMATS = {"Q4_K": (12, 256), "Q5_K": (13, 256), "Q6_K": (14, 256), "Q8_0": (8, 32)}  # type, block
MV_CASES = {  # name: (gate/up format, down format, E, k, fused gate_up, moe keyword arguments)
    "q4_k/q6_k k=8 (qwen3moe)": ("Q4_K", "Q6_K", 16, 8, False, {}),
    "q5_k/q4_k k=4 groups": ("Q5_K", "Q4_K", 16, 4, False, dict(gating="sigmoid", groups=(4, 2), scale=2.5)),
    "q6_k fused gelu k=1": ("Q6_K", "Q6_K", 8, 1, True, dict(act="gelu", norm=False)),
    "q8_0/q5_k k=8 of 8": ("Q8_0", "Q5_K", 8, 8, False, {}),
    "q4_k/q6_k k=12 of 16": ("Q4_K", "Q6_K", 16, 12, False, {}),
    "q8_0 fused k=4 escale": ("Q8_0", "Q8_0", 8, 4, True, dict(escale=True)),
    "q4_k llama4 weight_before k=1": ("Q4_K", "Q8_0", 8, 1, False, dict(gating="sigmoid", norm=False,
                                                                         weight_before=True)),
    "q4_k llama4 weight_before k=2": ("Q4_K", "Q4_K", 8, 2, False, dict(gating="sigmoid", norm=False,
                                                                         weight_before=True)),
}


def _qw(rt, name, rows, cols, rng):
    """(device weight of format name, its float32 dequantized values)."""
    from reflex_ipc.testing.opchecks import random_weight

    raw, ref = random_weight(name, rows, cols, rng)
    return rt.qweight(raw, MV_FORMATS[name][0], (rows, cols)), ref.astype(F32)


@pytest.mark.parametrize("variant", [None, "c", "d", "e"])
@pytest.mark.parametrize("name", sorted(MV_CASES))
@pytest.mark.parametrize("N", [1, 2, 3])
def test_cuda_moe_decode_takes_matvec_kernels(mem_ops, name, N, variant):
    """Few tokens with experts in matvec.cuh's formats: moe_mvglu{V}_* (the picked variant, or
    the forced one) and moe_mvdown_* with their grids and blocks (interpreted in numpy: the
    launch arguments, expert offsets, x_div, the clamped row blocks of D % 4 != 0), equal to
    numpy; REFLEX_MATVEC=old (matvec off) keeps moe.cuh's kernels."""
    from reflex_ipc.backends.cuda_ops import moe_mv_pick

    ops, rt = mem_ops, mem_ops.rt
    ops.matvec, ops.moe_mv_variant, ops.moe_mma, ops.moe_mma_min_n = True, variant, True, 4
    tg, td, E, k, fused, o = MV_CASES[name]
    rng = np.random.default_rng(len(name) * 11 + N)
    K, F, D = (2 * MV_FORMATS[tg][1], MV_FORMATS[td][1], 13)
    K = max(K, 64)
    wg, gate = _qw(rt, tg, E * F * (2 if fused else 1), K, rng)
    wu, up = (None, None) if fused else _qw(rt, tg, E * F, K, rng)
    wd, down = _qw(rt, td, E * D, F, rng)
    router = (rng.standard_normal((E, K)) * 0.3).astype(F32)
    x = (rng.standard_normal((N, K)) * 0.02).astype(F32)  # gate values of a few units (random blocks)
    lg = (rng.standard_normal((N, E)) * 2).astype(F32)
    escale = rng.uniform(0.5, 2, E).astype(F32) if o.get("escale") else None
    kw = dict(gating=o.get("gating", "softmax"), norm=o.get("norm", True), scale=o.get("scale", 1.0),
              act=o.get("act", "silu"), groups=o.get("groups"), weight_before=o.get("weight_before", False))
    want = NumpyOps().moe(x, router, gate, up, down, k, logits=lg, expert_scale=escale, **kw)
    got = ops.moe(ops.asarray(x), rt.weight(router), wg, wu, wd, k, logits=ops.asarray(lg),
                  expert_scale=None if escale is None else ops.asarray(escale), **kw)
    np.testing.assert_allclose(rt.f32(got.ptr, N * D).reshape(N, D), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    launches = {launch[0]: launch for launch in rt.launches}
    v = variant or moe_mv_pick(MV_FORMATS[tg][0])
    glu, down_k = f"moe_mvglu{v}_{tg.lower()}", f"moe_mvdown_{td.lower()}"
    pre = [route_name(E, kw["groups"])] + (["moe_weight_input_f32"] if kw["weight_before"] else [])
    assert [launch[0] for launch in rt.launches] == pre + [glu, down_k]
    R, W, G = {"c": (4, 2, 1), "d": (2, 1, 4), "e": (4, 1, 2)}[v]
    assert launches[glu][1:3] == ((-(-F // (R * G)), N * k, 1), (32 * W * G, 1, 1))
    assert launches[glu][3][7] == (1 if kw["weight_before"] else k)  # x_div
    assert launches[down_k][1:3] == ((-(-D // 4), N, 1), (32 * min(k, 8), 1, 1))
    assert ops.moe_mv_launches == 2 and ops.moe_mma_launches == 0


def test_cuda_moe_mv_off_prefill_and_mixed_forms(mem_ops):
    """The matvec switch off keeps moe.cuh's per-pair kernels; N >= moe_mma_min_n still takes the
    grouped tensor-core GEMMs; gate/up of two formats keep moe_mm for gate and up and take
    moe_mvdown for down."""
    ops, rt = mem_ops, mem_ops.rt
    ops.moe_mma, ops.moe_mma_min_n, ops._sms = True, 3, 132
    rng = np.random.default_rng(5)
    E, k, K, F, D = 8, 2, 256, 256, 12
    wg, _ = _qw(rt, "Q4_K", E * F, K, rng)
    wu, _ = _qw(rt, "Q4_K", E * F, K, rng)
    wd, _ = _qw(rt, "Q6_K", E * D, F, rng)
    router = rt.weight((rng.standard_normal((E, K)) * 0.3).astype(F32))
    rt.interpret = False  # launches only (the q-format moe_glu / mma kernels have no interpreter here)
    for matvec, N, want in ((False, 1, ["moe_glu_q4_k", "moe_down_q6_k"]), (True, 2, ["moe_mvglue_q4_k",
                                                                                        "moe_mvdown_q6_k"]),
                            (True, 3, ["moe_group_i32", "mma_x_f16", "mmaglu_moe_q4_k", "mma_moe_q6_k",
                                       "moe_wsum_f32"])):
        ops.matvec = matvec
        rt.launches.clear()
        lg = ops.asarray(rng.standard_normal((N, E)).astype(F32))
        ops.moe(ops.asarray(rng.standard_normal((N, K)).astype(F32)), router, wg, wu, wd, k, logits=lg)
        assert [launch[0] for launch in rt.launches] == ["moe_route_warp_f32"] + want
    rt.interpret = True
    rt.launches.clear()
    ops.matvec = True
    w16 = rt.weight((rng.standard_normal((E * F, K)) * 0.1).astype(np.float16).astype(F32), 1)
    wg32 = rt.weight((rng.standard_normal((E * F, K)) * 0.1).astype(F32), 0)
    wd8, down = _qw(rt, "Q8_0", E * D, F, rng)
    x = (rng.standard_normal((1, K)) * 0.5).astype(F32)
    lg = rng.standard_normal((1, E)).astype(F32)
    gate, up = rt.f32(wg32.ptr, E * F * K).reshape(E * F, K).copy(), \
        rt.mem[w16.ptr:w16.ptr + 2 * E * F * K].view(np.float16).astype(F32).reshape(E * F, K)
    want = NumpyOps().moe(x, None, gate, up, down, k, logits=lg)
    got = ops.moe(ops.asarray(x), router, wg32, w16, wd8, k, logits=ops.asarray(lg))
    np.testing.assert_allclose(rt.f32(got.ptr, D).reshape(1, D), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert [launch[0] for launch in rt.launches] == ["moe_route_warp_f32", "moe_mm_f32", "moe_mm_f16", "swiglu_f32",
                                                     "moe_mvdown_q8_0"]


def test_moe_mv_constants_match_the_kernels():
    """cuda_ops' MOE_MV_GLU, MOE_MVD_R / MOE_MVD_WARPS and MV_VARIANTS agree with kernels/moe_mv.cuh."""
    import os
    import re

    from reflex_ipc.backends import cuda_ops

    src = open(os.path.join(os.path.dirname(__file__), "..", "kernels", "moe_mv.cuh")).read()
    assert int(re.search(r"#define MOE_MVD_R (\d+)", src).group(1)) == cuda_ops.MOE_MVD_R
    assert int(re.search(r"#define MOE_MVD_WARPS (\d+)", src).group(1)) == cuda_ops.MOE_MVD_WARPS
    got = {m[0]: tuple(int(v) for v in m[1:]) for m in
           re.findall(r"RX_MOE_MVGLU_V\((\w), NAME, T, (\d+), (\d+), (\d+), (\d+)\)", src)}
    assert sorted(got) == sorted(cuda_ops.MOE_MV_GLU)
    assert all(got[v] == cuda_ops.MV_VARIANTS[v] for v in got)
    fmts = re.findall(r"^RX_MOE_MV\((\w+), T_\w+\)", src, re.M)
    assert sorted(fmts) == sorted(cuda_ops.MV_KERNEL.values())


def test_gpu_check_of_the_moe_mv_kernels_holds_on_numpy():
    """opchecks.check_moe_mv on the numpy oracle (given the CUDA backend's switches, which change
    nothing there; the GPU run checks the full MOE_MV_CASES and a captured graph): its references
    and tolerances hold, each call repeated gives the same bits, and its launch count, which only
    the CUDA backend's moe_mvglu / moe_mvdown raise, fails each row here."""
    from reflex_ipc.testing import opchecks

    ops = NumpyOps()
    assert opchecks.check_moe_mv(ops, np.random.default_rng(0)) == []  # not a CUDA backend: nothing
    ops.matvec, ops.moe_mv_variant, ops.moe_mma_min_n, ops.moe_mv_launches = False, None, 48, 0
    cases = [c for c in opchecks.MOE_MV_CASES if c[0].startswith(("qwen3moe", "q5_k", "gate/up", "gpt-oss"))]
    assert {c[1] if isinstance(c[1], str) else c[1][0] for c in cases} >= {"Q4_K", "Q5_K", "Q8_0"}
    rows = opchecks.check_moe_mv(ops, np.random.default_rng(0), cases=cases)
    assert len(rows) == 2 * 3 * len(cases)
    vals = [r for r in rows if "rel_err" in r]
    assert all(r["rel_err"] <= r["tol"] and r["moe_mv_launches"] == 0 and not r["ok"] for r in vals), vals[:3]
    assert all(r["ok"] for r in rows if r["case"].endswith("same bits"))
    assert (ops.matvec, ops.moe_mv_variant, ops.moe_mma_min_n) == (False, None, 48)  # restored
    assert opchecks.check_moe_mv in _run_all_checks()


def _run_all_checks():
    import inspect

    from reflex_ipc.testing import opchecks

    src = inspect.getsource(opchecks.run_all)
    return [getattr(opchecks, n) for n in opchecks.__dict__ if n.startswith("check_") and f" {n}," in src]


def test_cuda_moe_route_takes_the_warp_kernel_where_it_serves(mem_ops):
    """moe_route_warp_f32 (a warp per token, 4 a block) up to 256 experts without groups; past 256
    experts, with groups, or with moe_route_warp off, moe_route_f32; the same ids either way."""
    ops, rt = mem_ops, mem_ops.rt
    rng = np.random.default_rng(9)
    for E, groups, warp, N in ((256, None, True, 5), (257, None, True, 2), (64, (8, 3), True, 3),
                               (64, None, False, 3), (64, None, True, 1)):
        ops.moe_route_warp = warp
        rt.launches.clear()
        lg = (rng.standard_normal((N, E)) * 2).astype(F32)
        ids, wts = ops.moe_route(ops.asarray(lg), 8, gating="sigmoid", groups=groups, scale=2.5)
        want = "moe_route_warp_f32" if warp and E <= 256 and not groups else "moe_route_f32"
        name, grid, block = rt.launches[-1][:3]
        assert name == want
        assert (grid, block) == (((-(-N // 4), 1, 1), (128, 1, 1)) if want == "moe_route_warp_f32" else
                                 ((N, 1, 1), (256, 1, 1)))
        top, w = moe_route(lg, 8, "sigmoid", True, 2.5, None, groups)
        assert rt.i32(ids.ptr, N * 8).reshape(N, 8).tolist() == top.tolist()
        np.testing.assert_allclose(rt.f32(wts.ptr, N * 8).reshape(N, 8), w, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("v", ["c", "d", "e"])
@pytest.mark.parametrize("F", [32, 96, 768, 2880])
def test_moe_mvglu_blocks_write_each_pair_row_once(v, F):
    """moe_mvglu's grid (moe_mv_grid) and mv_row0 / mv_writer (matvec.cuh) emulated thread by
    thread: every (pair, row < F) written exactly once, rows read clamped inside the expert."""
    from reflex_ipc.backends.cuda_ops import MV_VARIANTS, moe_mv_grid

    R, W, G, _ = MV_VARIANTS[v]
    P = 3
    (gx, gy, gz), (bx, _, _) = moe_mv_grid(v, F, P)
    assert gy == P and gz == 1 and bx == 32 * W * G
    written = np.zeros((P, F), int)
    for p in range(gy):
        for b in range(gx):
            for warp in range(bx // 32):
                row0 = (b * G + warp // W) * R  # mv_row0
                reads = [min(row0 + r, F - 1) for r in range(R)]
                assert all(0 <= r < F for r in reads)
                if warp % W == 0:  # mv_writer: lane 0 of the group's first warp
                    for r in range(R):
                        if row0 + r < F:
                            written[p, row0 + r] += 1
    assert (written == 1).all()


@pytest.mark.parametrize("k", [1, 2, 6, 8, 9, 12, 16, 20])
def test_moe_mvdown_sums_each_row_in_slot_order(k):
    """moe_mvdown's chunks of min(k, 8) warps emulated: thread t < MOE_MVD_R adds pair j's weighted
    dot for j = 0, 1, ..., k - 1 in that order (the same bits as moe_down's loop), each once."""
    from reflex_ipc.backends.cuda_ops import MOE_MVD_R, MOE_MVD_WARPS

    nw = min(k, MOE_MVD_WARPS)
    order = {t: [] for t in range(MOE_MVD_R)}
    for j0 in range(0, k, nw):
        part = {}
        for warp in range(nw):  # each warp's pair of this chunk
            if j0 + warp < k:
                part[warp] = j0 + warp
        for t in range(MOE_MVD_R):  # after the barrier
            for w in range(min(nw, k - j0)):
                order[t].append(part[w])
    assert all(order[t] == list(range(k)) for t in order)
