"""The ops gpt-oss and Llama 4 added (attention sinks, chunked attention, pos_scale, moe's expert
biases / clamped SwiGLU / softmax_weight gating / weight before the experts): the GPU harness's
checks (reflex_ipc.testing.opchecks.check_attention_sinks_chunks, check_archops; CUDA in
scripts/gpu/gpu-check) on the numpy and cpu backends, and that they catch a backend that drops
the new math."""

import numpy as np
import pytest

from reflex_ipc.backends.numpy_ops import NumpyOps
from reflex_ipc.testing import opchecks


def _ops(name):
    if name == "numpy":
        return NumpyOps()
    from reflex_ipc.backends.cpu_ops import CpuOps

    return CpuOps(threads=2)


@pytest.mark.parametrize("backend", ("numpy", "cpu"))
def test_sinks_and_chunks_in_attention(backend):
    rows = opchecks.check_attention_sinks_chunks(_ops(backend), np.random.default_rng(1))
    assert len(rows) >= 30 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]


@pytest.mark.parametrize("backend", ("numpy", "cpu"))
def test_moe_variants_and_pos_scale(backend):
    rows = opchecks.check_archops(_ops(backend), np.random.default_rng(2))
    assert len(rows) >= 9 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]


def test_the_checks_catch_dropped_sinks_chunks_and_biases():
    class Broken(NumpyOps):
        def attention(self, *a, sinks=None, chunk=0, **kw):
            return super().attention(*a, **kw)

        def moe(self, *a, down_bias=None, **kw):
            return super().moe(*a, **kw)

    rows = opchecks.check_attention_sinks_chunks(Broken(), np.random.default_rng(1))
    bad = {r["case"] for r in rows if not r["ok"]}
    assert any("sinks" in c for c in bad) and any("chunk=512" in c and "sinks" not in c for c in bad), bad
    rows = opchecks.check_archops(Broken(), np.random.default_rng(2))
    assert any("gpt-oss" in r["case"] and not r["ok"] for r in rows)


def test_pos_scale_is_llama_cpp_s_temperature():
    """log(floor((pos + 1) / 8192) + 1) * 0.1 + 1: 1 below position 8191, then steps."""
    from reflex_ipc.backends.base import pos_temperature

    t = pos_temperature([0, 8190, 8191, 16382, 16383], 8192.0, 0.1, 1.0)
    assert t[0] == t[1] == 1.0
    np.testing.assert_allclose(t[2:], [1 + 0.1 * np.log(2), 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(3)], rtol=1e-7)
