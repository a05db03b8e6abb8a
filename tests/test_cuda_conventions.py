"""What the CUDA backend assumes of its callers, checked without a GPU.

- CudaOps.to_numpy / copy of a weight kept in a file's arena wait for the background upload
  (gemma4 reads its per-layer `layer_output_scale` at load, before any kernel has run: it read
  the arena before the upload finished, which is why its CUDA logits did not match numpy's on
  the H200 on 2026-11-30).
- The models whose CUDA runs are checked on the GPU host (gemma4's variants, deepseek2's),
  run on the numpy backend through a proxy that asserts, at every op call, the argument
  conventions CudaOps' kernels rely on without checking them all (contiguous float32 arrays,
  the head widths of kv_store / attention, norm and rope vector lengths, the two broadcasts
  of add / mul): a violation there would be a silent CUDA-vs-numpy difference."""

import numpy as np
import pytest

from reflex_ipc.backends import cuda_ops
from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.cuda.arrays import DeviceArray
from reflex_ipc.cuda.weights import WeightArena


class _Recorder:
    def __init__(self):
        self.events = []


def test_to_numpy_and_copy_of_an_arena_weight_wait_for_the_upload():
    rec = _Recorder()

    class Arena(WeightArena):
        def __init__(self):  # no device: only wait() matters here
            pass

        def wait(self):
            rec.events.append("wait")

    class Drv:
        def memcpy_dtoh_async(self, out, ptr, stream):
            rec.events.append("dtoh")
            out[...] = 0.5

        def memcpy_dtod_async(self, dst, src, n, stream):
            rec.events.append("dtod")

    class Stream:
        def synchronize(self):
            pass

    class Rt:
        drv, stream = Drv(), Stream()

    ops = object.__new__(cuda_ops.CudaOps)
    ops.rt = Rt()
    w = DeviceArray(4096, (1,), "float32", Arena())
    assert float(ops.to_numpy(w)[0]) == 0.5
    assert rec.events == ["wait", "dtoh"]
    rec.events.clear()
    ops.copy(w, DeviceArray(8192, (1,), "float32", None))
    assert rec.events == ["wait", "dtod"]
    rec.events.clear()
    ops.to_numpy(DeviceArray(8192, (1,), "float32", None))  # an activation: nothing to wait for
    assert rec.events == ["dtoh"]


class CudaConventions(NumpyOps):
    """NumpyOps that asserts CudaOps' preconditions on every call it checks."""

    def __init__(self):
        super().__init__(blas_threads=None)
        self.calls = {}

    def _arr(self, *xs):
        for x in xs:
            if isinstance(x, np.ndarray):
                assert x.flags.c_contiguous, f"non-contiguous {x.shape}: a DeviceArray has no strides"
                assert x.dtype in (np.float32, np.int32), x.dtype

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def add(self, a, b, out=None):
        self._count("add")
        self._arr(a, b)
        assert a.shape == b.shape or (b.ndim == 1 and b.shape[0] == a.shape[-1]), (a.shape, b.shape)
        return super().add(a, b, out)

    def mul(self, a, b, out=None):
        self._count("mul")
        self._arr(a, b)
        assert a.shape == b.shape or (b.ndim == 1 and b.shape[0] == a.shape[-1]) or (
            a.ndim == 2 and b.shape == (a.shape[0], 1)), (a.shape, b.shape)
        return super().mul(a, b, out)

    def rms_norm(self, x, w, eps):
        self._count("rms_norm")
        self._arr(x, w)
        assert w is None or w.shape == (x.shape[-1],), (x.shape, None if w is None else w.shape)
        return super().rms_norm(x, w, eps)

    def _rope_args(self, x, n_rot, freq_factors, w=None):
        self._arr(x, freq_factors, w)
        assert x.ndim == 3
        n_rot = x.shape[-1] if n_rot is None else n_rot
        assert n_rot % 2 == 0 and 0 < n_rot <= x.shape[-1], (n_rot, x.shape)
        assert freq_factors is None or freq_factors.shape[0] >= n_rot // 2, (freq_factors.shape, n_rot)
        assert w is None or w.shape == (x.shape[-1],)

    def rope(self, x, pos, *, n_rot=None, freq_factors=None, **kw):
        self._count("rope")
        self._rope_args(x, n_rot, freq_factors)
        return super().rope(x, pos, n_rot=n_rot, freq_factors=freq_factors, **kw)

    def rms_norm_rope(self, x, w, eps, pos, *, n_rot=None, freq_factors=None, **kw):
        self._count("rms_norm_rope")
        self._rope_args(x, n_rot, freq_factors, w)
        return super().rms_norm_rope(x, w, eps, pos, n_rot=n_rot, freq_factors=freq_factors, **kw)

    def kv_store(self, k_cache, v_cache, k, v, slots):
        if getattr(self, "_in_kv_store", False):  # NumpyOps' keys-only store calls itself
            return super().kv_store(k_cache, v_cache, k, v, slots)
        self._count("kv_store")
        self._arr(k, v)
        N, Hkv, hd = k.shape
        assert k_cache.shape[0] == Hkv and k_cache.shape[2] == hd, (k.shape, k_cache.shape)
        if v is not None:  # the kernel writes v with k's head width
            assert v.shape == k.shape and v_cache.shape == k_cache.shape, (v.shape, v_cache.shape)
        self._in_kv_store = True
        try:
            return super().kv_store(k_cache, v_cache, k, v, slots)
        finally:
            self._in_kv_store = False

    def attention(self, q, k_cache, v_cache, pos, n_kv, *, scale, softcap=0.0, causal=True, window=0, mask=None,
                  v_dim=None):
        self._count("attention")
        self._arr(q, mask)
        N, Hq, hd = q.shape
        assert k_cache.shape[2] == hd and Hq % k_cache.shape[0] == 0, (q.shape, k_cache.shape)
        if v_cache is not None:  # the kernel reads values with q's head width, one head count
            assert v_cache.shape == k_cache.shape and hd <= cuda_ops.ATT_MAX_HD, (v_cache.shape, k_cache.shape)
        else:
            assert k_cache.shape[0] == 1 and 0 < v_dim <= hd <= cuda_ops.MLA_MAX_D
        assert mask is None or (not causal and window == 0 and mask.shape == (N, n_kv))
        return super().attention(q, k_cache, v_cache, pos, n_kv, scale=scale, softcap=softcap, causal=causal,
                                 window=window, mask=mask, v_dim=v_dim)

    def matmul(self, x, w, out=None, accumulate=False):
        self._count("matmul")
        self._arr(x, out)
        assert x.shape[-1] == w.shape[1] and x.shape[-1] % 8 == 0, (x.shape, w.shape)
        assert out is None or out.shape == x.shape[:-1] + (w.shape[0],)
        return super().matmul(x, w, out, accumulate)

    def head_matmul(self, x, w):
        self._count("head_matmul")
        self._arr(x)
        assert x.ndim == 3 and w.shape[1] == x.shape[2] and w.shape[0] % x.shape[1] == 0 and x.shape[2] % 8 == 0
        return super().head_matmul(x, w)

    def split(self, x, sizes):
        self._count("split")
        self._arr(x)
        return super().split(x, sizes)

    def concat(self, xs):
        self._count("concat")
        self._arr(*xs)
        assert len({x.shape[:-1] for x in xs}) == 1
        return super().concat(xs)


@pytest.fixture(scope="module")
def family_files(tmp_path_factory):
    from reflex_ipc.testing.synthetic import example_gguf, examples

    d = tmp_path_factory.mktemp("conventions")
    return {name: example_gguf(name, d / f"{name}.gguf", qtype="Q8_0") for name, (arch, spec) in examples().items()
            if arch in ("gemma4", "deepseek2") and not spec.get("quantize")}


@pytest.mark.parametrize("name", ["gemma4", "gemma4_moe", "gemma4_e2b", "gemma4_fused_qkv", "deepseek2_v2",
                                  "deepseek2_v3"])
def test_models_keep_the_cuda_conventions(family_files, name):
    """Prefill, then decode steps (gpu_check_models' pattern), on the convention-checking numpy
    ops: same logits as plain NumpyOps."""
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.models import load_model
    from reflex_ipc.runtime.batch import Batch

    def run(ops):
        with GGUFFile(family_files[name]) as f:
            model = load_model(ops, f)
            state = model.new_state(ops, 64)
            ids = [1, 504, 3458, 282, 4649, 314, 253, 1345]
            ids = [t % model.hp.n_vocab for t in ids]
            outs = [model.forward(state, Batch(ops, ids, list(range(len(ids)))), rows=slice(len(ids) - 1, None))]
            for i in range(3):
                outs.append(model.forward(state, Batch(ops, [ids[i]], [len(ids) + i])))
            return [np.array(o) for o in outs]

    ops = CudaConventions()
    got = run(ops)
    want = run(NumpyOps(blas_threads=None))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert ops.calls.get("attention") and ops.calls.get("kv_store")


def test_auto_keeps_wide_gemma4_heads_off_cuda(tmp_path):
    """Gemma 4 runs on CUDA unless its heads are wider than the CUDA attention kernel's limit
    (real files: 512 on the global layers); then auto picks the cpu backend."""
    from reflex_ipc.gguffile import GGUFFile
    from reflex_ipc.models import CUDA_MAX_HEAD_DIM, NO_CUDA, cuda_unfit
    from reflex_ipc.testing.synthetic import example_gguf

    assert CUDA_MAX_HEAD_DIM == cuda_ops.ATT_MAX_HD and "gemma4" not in NO_CUDA
    small = example_gguf("gemma4", tmp_path / "small.gguf")
    with GGUFFile(small) as f:
        assert cuda_unfit(f) is None
    wide = example_gguf("gemma4", tmp_path / "wide.gguf", keys={
        "attention.key_length": 512, "attention.value_length": 512, "rope.dimension_count": 512})
    with GGUFFile(wide) as f:
        assert "512" in cuda_unfit(f)


def test_auto_loads_deepseek2_on_cpu_without_cuda(family_files, monkeypatch):
    """Without CUDA, device auto runs deepseek2 (latent attention) and gemma4 on the cpu backend."""
    from reflex_ipc import cuda
    from reflex_ipc.engine import load_runner

    monkeypatch.setattr(cuda, "start_init", lambda: False)
    assert load_runner(family_files["deepseek2_v3"], device="auto", n_ctx=32).info()["backend"] == "cpu"
    assert load_runner(family_files["gemma4"], device="auto", n_ctx=32).info()["backend"] == "cpu"
