"""reflex_ipc.quants against gguf.quants (the reference), bit for bit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gguf
import gguf.quants as gq

from reflex_ipc import quants
from reflex_ipc.errors import ReflexError
from reflex_ipc.ggml_types import TYPES
from reflex_ipc.gguffile import GGUFFile

# byte ranges of each block format's float16 scale fields (Q8_K's scale is a float32)
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0],
    "IQ1_M": [], "TQ1_0": [52], "TQ2_0": [64], "MXFP4": [],  # IQ1_M: d in 4 nibbles (below)
}
ELEMENTWISE = ["F32", "F16", "BF16"]
BLOCK_TYPES = list(F16_FIELDS) + ["Q8_K"]
ALL = ELEMENTWISE + BLOCK_TYPES


def random_raw(name, n_blocks, rng, finite):
    """n_blocks of random bytes; with finite=True the scales (or elements) are finite floats."""
    tid, blk, bsize = TYPES[name]
    b = rng.integers(0, 256, (n_blocks, bsize), dtype=np.uint8)
    if finite:
        if name in ELEMENTWISE:
            dt = {"F32": "<f4", "F16": "<f2"}.get(name)
            vals = rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-4, 4, n_blocks)
            if dt:
                b = vals.astype(dt).view(np.uint8).reshape(n_blocks, bsize)
            else:  # bfloat16: the high half of a float32
                b = (vals.astype("<f4").view("<u4") >> 16).astype("<u2").view(np.uint8)
                b = b.reshape(n_blocks, bsize)
        elif name == "Q8_K":
            b[:, :4] = (rng.standard_normal((n_blocks, 1)) * 0.01).astype("<f4").view(np.uint8)
        else:
            for at in F16_FIELDS[name]:
                scale = rng.standard_normal((n_blocks, 1)) * 10.0 ** rng.integers(-5, 2, (n_blocks, 1))
                b[:, at:at + 2] = scale.astype("<f2").view(np.uint8)
            if name == "MXFP4":  # the E8M0 scale byte: 2^-27 .. 2^12
                b[:, 0] = rng.integers(100, 140, n_blocks)
            if name == "IQ1_M":  # the float16 d in the top nibbles of the 4 scale words (bytes 48..55)
                d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-5, 2, n_blocks)).astype("<f2")
                h = d.view("<u2").astype(np.uint16)
                sc = np.ascontiguousarray(b[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
                for k in range(4):
                    sc[:, k] |= ((h >> (4 * k)) & 0xF) << 12
                b[:, 48:56] = sc.view(np.uint8)
    return b.reshape(-1)


def reference(name, raw):
    tid, blk, bsize = TYPES[name]
    if name == "Q8_K":  # not in gguf.quants: ggml's dequantize_row_q8_K, y = d * q
        b = raw.reshape(-1, bsize)
        d = np.ascontiguousarray(b[:, :4]).view("<f4")
        return (d * b[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)
    return np.asarray(gq.dequantize(raw, gguf.GGMLQuantizationType(tid)), dtype=np.float32).reshape(-1)


def assert_bits_equal(got, want):
    assert got.dtype == np.float32 and got.shape == want.shape
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        raise AssertionError(f"{len(bad)} of {got.size} values differ, first at {bad[0]}: "
                             f"{got[bad[0]]!r} != {want[bad[0]]!r}")


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=15, deadline=None)
@given(n_blocks=st.integers(1, 48), seed=st.integers(0, 2**32 - 1), finite=st.booleans())
def test_matches_reference(name, n_blocks, seed, finite):
    rng = np.random.default_rng(seed)
    raw = random_raw(name, n_blocks, rng, finite)
    tid, blk, _ = TYPES[name]
    with np.errstate(all="ignore"):
        want = reference(name, raw)
    got = quants.dequantize(raw, tid, n_blocks * blk)
    assert_bits_equal(got, want)
    if finite and name not in ELEMENTWISE:
        assert np.isfinite(got).all()


@pytest.mark.parametrize("name", ALL)
def test_fully_random_blocks(name):
    """Random bytes everywhere, scales included (inf, nan, subnormals): still bit-exact."""
    rng = np.random.default_rng(1234)
    tid, blk, _ = TYPES[name]
    raw = random_raw(name, 2000, rng, finite=False)
    with np.errstate(all="ignore"):
        want = reference(name, raw)
    assert_bits_equal(quants.dequantize(raw, tid, 2000 * blk), want)


@pytest.mark.parametrize("name", ["F16", "Q4_0", "Q4_K", "Q6_K", "Q8_0", "IQ2_XXS", "IQ1_M", "MXFP4"])
def test_chunks_and_threads(monkeypatch, name):
    """Results do not depend on how the blocks are cut into chunks and threads."""
    monkeypatch.setattr(quants, "_CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(quants, "_THREAD_MIN_ELEMENTS", 3000)
    monkeypatch.setattr(quants, "_cpu_count", lambda: 3)
    rng = np.random.default_rng(7)
    tid, blk, _ = TYPES[name]
    n_blocks = 20000 // blk + 3
    raw = random_raw(name, n_blocks, rng, finite=True)
    assert_bits_equal(quants.dequantize(raw, tid, n_blocks * blk), reference(name, raw))


def test_f32_is_a_view():
    raw = np.arange(8, dtype="<f4").view(np.uint8)
    out = quants.dequantize(raw, 0, 8)
    assert np.shares_memory(out, raw) and out.tolist() == list(range(8))


@pytest.mark.parametrize("tid, label", [(9, "Q8_1"), (99, "type99"), (40, "type40")])
def test_unsupported_type(tid, label):
    with pytest.raises(ReflexError) as e:
        quants.dequantize(np.zeros(1024, np.uint8), tid, 256)
    assert e.value.kind == "gguf_error" and label in e.value.message


def test_bad_sizes():
    with pytest.raises(ReflexError, match="whole number") as e:
        quants.dequantize(np.zeros(18, np.uint8), TYPES["Q4_0"][0], 33)
    assert e.value.kind == "gguf_error"
    with pytest.raises(ReflexError, match="need 36 bytes, got 18"):
        quants.dequantize(np.zeros(18, np.uint8), TYPES["Q4_0"][0], 64)


def test_dequantize_tensor_shapes(tmp_path):
    """Tensors written with GGUFWriter come back in numpy order, equal to the reference."""
    rng = np.random.default_rng(3)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    specs = {
        "f32_3d": ("F32", (2, 3, 64)),
        "f16_2d": ("F16", (5, 32)),
        "q4_0_2d": ("Q4_0", (3, 64)),
        "q8_0_3d": ("Q8_0", (2, 2, 96)),
        "q6_k_2d": ("Q6_K", (2, 512)),
        "q5_1_1d": ("Q5_1", (64,)),
    }
    expected = {}
    for tname, (qname, shape) in specs.items():
        tid, blk, bsize = TYPES[qname]
        n_blocks = int(np.prod(shape)) // blk
        raw = random_raw(qname, n_blocks, rng, finite=True)
        expected[tname] = reference(qname, raw).reshape(shape)
        byte_shape = (*shape[:-1], shape[-1] // blk * bsize)
        w.add_tensor(tname, raw.reshape(byte_shape), raw_dtype=gguf.GGMLQuantizationType(tid))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        for tname, want in expected.items():
            got = quants.dequantize_tensor(f, tname)
            assert got.shape == want.shape, tname
            assert_bits_equal(got, want)


def test_smollm2_tensors_match_gguf_reader(smollm2):
    path = smollm2
    reader = gguf.GGUFReader(path)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type.name, t)  # one tensor of each type in the file
    assert {"F32", "Q4_1", "Q8_0"} <= set(by_type)
    with GGUFFile(path) as f:
        for t in by_type.values():
            want = np.asarray(gq.dequantize(t.data, t.tensor_type), dtype=np.float32)
            got = quants.dequantize_tensor(f, t.name)
            assert got.shape == want.shape, t.name
            assert_bits_equal(got, want)
