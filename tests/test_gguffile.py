"""GGUFFile against gguf.GGUFReader, and fuzzed: every input parses or raises GGUFError."""

import os
import signal
import struct
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf
from gguf import GGUFValueType as VT

from reflex_ipc import gguffile
from reflex_ipc.ggml_types import TYPES
from reflex_ipc.gguffile import ArrayValue, GGUFError, GGUFFile

SCALAR_FMT = {VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I",
              VT.INT32: "i", VT.FLOAT32: "f", VT.BOOL: "?", VT.UINT64: "Q", VT.INT64: "q",
              VT.FLOAT64: "d"}


@pytest.fixture(params=["numpy", "split"], autouse=True)
def bulk_walk(request):
    """Every test runs with each of the two bulk string walks."""
    walk = {"numpy": gguffile._walk_strings_numpy, "split": gguffile._walk_strings_split}
    saved = gguffile._bulk_walk
    gguffile._bulk_walk = lambda: walk[request.param]
    yield request.param
    gguffile._bulk_walk = saved


# -- an independent GGUF serializer that records where every field is -------------------------

class Builder:
    """Writes a GGUF image and a layout: (kind, offset, size) for each field it wrote."""

    def __init__(self):
        self.buf = bytearray()
        self.layout = []

    def put(self, kind, fmt, value):
        self.layout.append((kind, len(self.buf), struct.calcsize("<" + fmt)))
        self.buf += struct.pack("<" + fmt, value)

    def string(self, kind, s):
        raw = s.encode() if isinstance(s, str) else bytes(s)
        self.put(kind + ".len", "Q", len(raw))
        self.layout.append((kind + ".bytes", len(self.buf), len(raw)))
        self.buf += raw

    def value(self, vtype, v):
        if vtype in SCALAR_FMT:
            self.put("scalar", SCALAR_FMT[vtype], v)
        elif vtype == VT.STRING:
            self.string("string", v)
        elif vtype == VT.ARRAY:
            etype, items = v
            self.put("array.type", "I", etype)
            self.put("array.count", "Q", len(items))
            for item in items:
                self.value(etype, item)
        else:
            raise ValueError(vtype)


def build(kvs, tensors=(), version=3, alignment=32):
    """kvs: [(key, vtype, value)], arrays as (etype, items); tensors: [(name, dims, type, bytes)]."""
    b = Builder()
    b.buf += b"GGUF"
    b.put("version", "I", version)
    b.put("tensor_count", "Q", len(tensors))
    b.put("kv_count", "Q", len(kvs))
    for key, vtype, v in kvs:
        b.string("key", key)
        b.put("value_type", "I", vtype)
        b.value(vtype, v)
    rel = 0
    placed = []
    for name, dims, ttype, data in tensors:
        b.string("tensor.name", name)
        b.put("tensor.n_dims", "I", len(dims))
        for d in dims:
            b.put("tensor.dim", "Q", d)
        b.put("tensor.type", "I", ttype)
        b.put("tensor.offset", "Q", rel)
        placed.append((rel, data))
        rel += -(-len(data) // alignment) * alignment
    data_start = -(-len(b.buf) // alignment) * alignment
    b.buf += bytes(data_start - len(b.buf))
    for rel, data in placed:
        b.buf += bytes(data_start + rel - len(b.buf))
        b.layout.append(("tensor.data", len(b.buf), len(data)))
        b.buf += data
    return bytes(b.buf), b.layout


def vocab_like(rng, n, specials=()):
    """n byte-level-BPE-ish token strings, with `specials` (index, bytes) put in place."""
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz\xc4\xa0", np.uint8)
    out = [bytes(rng.choice(letters, rng.integers(1, 12))) for _ in range(n)]
    for i, s in specials:
        out[i] = s
    return out


def sample_kvs(rng, n_vocab=3000, specials=()):
    return [
        ("general.architecture", VT.STRING, "llama"),
        ("general.alignment", VT.UINT32, 32),
        ("llama.block_count", VT.UINT32, 2),
        ("u8", VT.UINT8, 255), ("i8", VT.INT8, -128), ("u16", VT.UINT16, 65535),
        ("i16", VT.INT16, -32768), ("i32", VT.INT32, -2**31), ("f32", VT.FLOAT32, 1.5),
        ("bool", VT.BOOL, True), ("u64", VT.UINT64, 2**64 - 1), ("i64", VT.INT64, -2**63),
        ("f64", VT.FLOAT64, -2.25), ("empty_string", VT.STRING, ""),
        ("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, vocab_like(rng, n_vocab, specials))),
        ("tokenizer.ggml.scores", VT.ARRAY, (VT.FLOAT32, [float(i) for i in range(7)])),
        ("nested", VT.ARRAY, (VT.ARRAY, [(VT.INT32, [1, 2]), (VT.STRING, ["a", "bc"]),
                                         (VT.ARRAY, [(VT.UINT8, [7])])])),
        ("empty_u32_array", VT.ARRAY, (VT.UINT32, [])),
        ("empty_string_array", VT.ARRAY, (VT.STRING, [])),
    ]


def sample_tensors():
    q4 = TYPES["Q4_0"]
    return [
        ("a.weight", (64, 2), q4[0], bytes(range(2 * 2 * q4[2]))),
        ("b.weight", (3,), 0, struct.pack("<3f", 1, 2, 3)),
        ("c.bias", (2, 1, 1, 2), 1, bytes(8)),
    ]


# -- gguf.GGUFReader as the reference -----------------------------------------------------------

def reader_value(field):
    """A GGUFReader field as plain Python (string bytes kept as bytes)."""
    main = field.types[0]
    if main == VT.STRING:
        return bytes(field.parts[field.data[0]])
    if main != VT.ARRAY:
        return field.parts[field.data[0]].tolist()[0]
    if field.types[-1] == VT.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    return [field.parts[i].tolist()[0] for i in field.data]


def ours_value(f, key):
    v = f.metadata[key]
    if isinstance(v, ArrayValue):
        return v.raw_strings() if v.elem_type == gguffile.T_STRING else v.tolist()
    return v.encode() if isinstance(v, str) else v


_READERS = {}


def assert_same_as_reader(path, cache=False):
    r = _READERS.get(path) or gguf.GGUFReader(path)
    if cache:
        _READERS[path] = r
    with GGUFFile(path) as f:
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == keys
        for k in keys:
            field = r.fields[k]
            assert f.value_types[k] == field.types[0], k
            if field.types[0] == VT.ARRAY and len(field.types) > 1 and field.types[1] == VT.ARRAY:
                continue  # GGUFReader does not expose nested arrays element-wise
            want = reader_value(field)
            got = ours_value(f, k)
            if field.types[-1] in (VT.FLOAT32, VT.FLOAT64):  # compare bits: nan == nan
                fmt = "<f" if field.types[-1] == VT.FLOAT32 else "<d"
                want = [struct.pack(fmt, x) for x in (want if isinstance(want, list) else [want])]
                got = [struct.pack(fmt, x) for x in (got if isinstance(got, list) else [got])]
            assert got == want, k
        assert [t.name for t in r.tensors] == list(f.tensors)
        for t in r.tensors:
            ours = f.tensors[t.name]
            assert list(ours.shape) == t.shape.tolist(), t.name
            assert ours.ggml_type == int(t.tensor_type)
            assert ours.n_elements == t.n_elements
            assert ours.nbytes == t.n_bytes
            assert ours.offset == t.data_offset
            assert f.tensor_data(t.name).tobytes() == t.data.tobytes()
        return f.version, f.alignment, f.data_offset


def write(path, data):
    with open(path, "wb") as fh:
        fh.write(data)
    return path


# -- against the reader -------------------------------------------------------------------------

def test_smollm2_matches_reader(smollm2):
    version, alignment, _ = assert_same_as_reader(smollm2, cache=True)
    assert version == 3 and alignment == 32


def writer_file(path, *, alignment=None, n_vocab=3000, arch="llama"):
    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(str(path), arch)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -2**62)
    w.add_float64("t.f64", 1e300)
    w.add_bool("t.bool", False)
    w.add_string("t.str", "héllo wörld")
    w.add_key_value("t.empty", "", VT.STRING)  # add_string skips empty strings
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, float("nan"), float("inf")])
    w.add_array("t.arr_bool", [True, False, True])
    w.add_key_value("t.arr_u64", [1, 2**64 - 1], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr_f64", [1.25, -0.0], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_key_value("t.arr_i16", [-1, 7], VT.ARRAY, sub_type=VT.INT16)
    w.add_array("t.arr_str", ["a", "", "ccc"])
    w.add_array("t.nested", [[1, 2, 3], ["x", "yz"], [[True], [False, True]]])
    w.add_array("tokenizer.ggml.tokens", [s.decode("latin-1") for s in vocab_like(rng, n_vocab)])
    rng2 = np.random.default_rng(6)
    for name, shape, qname in [("w.q8", (4, 64), "Q8_0"), ("w.f32", (3, 5), "F32"),
                               ("w.f16", (7,), "F16"), ("w.q4k", (2, 256), "Q4_K")]:
        tid, blk, bsize = TYPES[qname]
        raw = rng2.integers(0, 256, (*shape[:-1], shape[-1] // blk * bsize), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(tid))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 1, 64, 4096])
def test_writer_file_matches_reader(tmp_path, alignment):
    path = writer_file(tmp_path / "w.gguf", alignment=alignment)
    version, align, data_offset = assert_same_as_reader(path)
    assert version == 3 and align == (alignment or 32) and data_offset % align == 0
    with GGUFFile(path) as f:
        assert f.get("t.nested") == [[1, 2, 3], ["x", "yz"], [[True], [False, True]]]
        assert f.get("t.str") == "héllo wörld" and f.get("t.empty") == ""
        assert f.metadata["t.arr_u64"].numpy().tolist() == [1, 2**64 - 1]
        assert f.metadata["t.arr_bool"].numpy().tolist() == [True, False, True]
        assert f.arch_get("block_count") is None and f.architecture == "llama"
        assert f.tensors["w.q4k"].shape == (256, 2)


def test_version_2(tmp_path):
    data = bytearray(open(writer_file(tmp_path / "w.gguf"), "rb").read())
    struct.pack_into("<I", data, 4, 2)
    path = write(tmp_path / "v2.gguf", data)
    assert assert_same_as_reader(path)[0] == 2


def string_array_case(rng, n, where, kinds):
    specials = []
    pos = {"start": [0, 1], "middle": [n // 2, n // 2 + 1], "end": [n - 2, n - 1]}[where]
    for i, kind in zip(pos, kinds):
        specials.append((i, {"empty": b"", "long": bytes(rng.integers(1, 256, 300, dtype=np.uint8)),
                             "len256": b"x" * 256, "nul": b"a\x00\x00\x00\x00\x00\x00\x00\x00b",
                             "nul1": b"\x00", "nulstart": b"\x00abc"}[kind]))
    return vocab_like(rng, n, specials)


@pytest.mark.parametrize("n", [5, 2047, 2048, 3000])
@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("kinds", [("empty", "long"), ("len256", "nul"), ("nul1", "nulstart"),
                                   ("empty", "empty")])
def test_string_arrays_match_reader(tmp_path, n, where, kinds):
    rng = np.random.default_rng(n)
    strings = string_array_case(rng, n, where, kinds)
    data, _ = build([("general.architecture", VT.STRING, "llama"),
                     ("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, strings)),
                     ("tokenizer.ggml.merges", VT.ARRAY, (VT.STRING, strings[::-1])),
                     ("after", VT.UINT32, 7)])
    path = write(tmp_path / "s.gguf", data)
    assert_same_as_reader(path)
    with GGUFFile(path) as f:
        assert f.metadata["tokenizer.ggml.tokens"].raw_strings() == strings
        assert f.metadata["tokenizer.ggml.merges"].raw_strings() == strings[::-1]
        assert f.get("after") == 7


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2048, 6000),
       n_odd=st.integers(0, 40), odd_len=st.sampled_from([0, 255, 256, 257, 1000]))
def test_string_arrays_random(tmp_path, seed, n, n_odd, odd_len):
    """Runs of short strings broken by empty, long and NUL-laden ones, anywhere."""
    rng = np.random.default_rng(seed)
    specials = [(int(i), bytes(rng.integers(0, 3, odd_len, dtype=np.uint8)))
                for i in rng.integers(0, n, n_odd)]
    strings = vocab_like(rng, n, specials)
    data, _ = build([("tokenizer.ggml.tokens", VT.ARRAY, (VT.STRING, strings)),
                     ("tail", VT.STRING, "end")])
    with GGUFFile(write(tmp_path / "r.gguf", data)) as f:
        assert f.metadata["tokenizer.ggml.tokens"].raw_strings() == strings
        assert f.get("tail") == "end"


def test_builder_matches_reader(tmp_path):
    """The test serializer writes what GGUFReader reads (so the fuzz base is a real GGUF)."""
    data, _ = build(sample_kvs(np.random.default_rng(0))[:-2], sample_tensors())
    assert_same_as_reader(write(tmp_path / "b.gguf", data))


def test_empty_arrays(tmp_path):
    data, _ = build([("e32", VT.ARRAY, (VT.UINT32, [])), ("es", VT.ARRAY, (VT.STRING, [])),
                     ("ea", VT.ARRAY, (VT.ARRAY, []))])
    with GGUFFile(write(tmp_path / "e.gguf", data)) as f:
        assert f.get("e32") == [] and f.get("es") == [] and f.get("ea") == []
        assert f.metadata["e32"].numpy().shape == (0,)


# -- errors ------------------------------------------------------------------------------------

def base_file():
    # the vocabulary has an empty, a long and a NUL-laden string: both string walks get fuzzed
    specials = [(10, b""), (1500, b"y" * 300), (2990, b"\x00" * 9)]
    return build(sample_kvs(np.random.default_rng(0), specials=specials), sample_tensors())


def patched(data, layout, kind, fmt, value, nth=0):
    """data with the nth field of `kind` overwritten by value."""
    offs = [off for k, off, _ in layout if k == kind]
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offs[nth], value)
    return bytes(out)


def expect_error(tmp_path, data, field=None, match=None):
    with pytest.raises(GGUFError) as e:
        GGUFFile(write(tmp_path / "x.gguf", data))
    assert e.value.field is not None or e.value.offset is not None
    if field is not None:
        assert field in (e.value.field or ""), e.value
    if match is not None:
        assert match in str(e.value), e.value
    return e.value


def test_errors(tmp_path):
    data, layout = base_file()
    GGUFFile(write(tmp_path / "ok.gguf", data)).close()
    expect_error(tmp_path, b"GGUX" + data[4:], "magic")
    expect_error(tmp_path, data[:4] + struct.pack("<I", 3 << 24) + data[8:], "version", "big-endian")
    expect_error(tmp_path, data[:4] + struct.pack("<I", 1) + data[8:], "version")
    expect_error(tmp_path, data[:20], "header")
    expect_error(tmp_path, patched(data, layout, "kv_count", "Q", 2**40), "kv_count")
    expect_error(tmp_path, patched(data, layout, "tensor_count", "Q", 2**62), "tensor_count")
    expect_error(tmp_path, patched(data, layout, "value_type", "I", 13), "general.architecture",
                 "unknown metadata value type")
    expect_error(tmp_path, patched(data, layout, "array.type", "I", 99), "tokenizer.ggml.tokens")
    expect_error(tmp_path, patched(data, layout, "array.count", "Q", 2**63), "tokenizer.ggml.tokens")
    expect_error(tmp_path, patched(data, layout, "tensor.n_dims", "I", 5), "a.weight.n_dims")
    expect_error(tmp_path, patched(data, layout, "tensor.type", "I", 77), "a.weight.type")
    expect_error(tmp_path, patched(data, layout, "tensor.dim", "Q", 2**40), "a.weight.shape")
    expect_error(tmp_path, patched(data, layout, "tensor.dim", "Q", 48), "a.weight.shape",
                 "block of 32")
    expect_error(tmp_path, patched(data, layout, "tensor.offset", "Q", 3), "a.weight.offset")
    expect_error(tmp_path, patched(data, layout, "tensor.offset", "Q", 2**60), "a.weight.data")
    expect_error(tmp_path, data[:-1], "c.bias.data")
    for align in (0, 3, 2**32 - 1):
        expect_error(tmp_path, patched(data, layout, "scalar", "I", align), "general.alignment")


def test_errors_in_values(tmp_path):
    cases = [
        ([("a", VT.STRING, "x"), ("a", VT.STRING, "y")], "a", "duplicate metadata key"),
        ([("general.alignment", VT.FLOAT32, 32.0)], "general.alignment", None),
        ([("general.alignment", VT.BOOL, True)], "general.alignment", None),
        ([("general.alignment", VT.ARRAY, (VT.UINT32, [32]))], "general.alignment", None),
        ([("general.alignment", VT.INT32, -32)], "general.alignment", None),
        ([(b"\xff\xfe", VT.UINT8, 1)], "kv[0].key", "UTF-8"),
        ([("s", VT.STRING, b"\xc3")], "s", "UTF-8"),
    ]
    deep = (VT.UINT8, [1])
    for _ in range(10):
        deep = (VT.ARRAY, [deep])
    cases.append(([("deep", VT.ARRAY, deep)], "deep", "nested"))
    for kvs, field, match in cases:
        expect_error(tmp_path, build(kvs)[0], field, match)
    two = [("t", (4,), 0, bytes(16)), ("t", (4,), 0, bytes(16))]
    expect_error(tmp_path, build([], two)[0], "tensor[1]", "duplicate tensor name")
    scalar_q = [("q", (), TYPES["Q4_0"][0], b"")]
    expect_error(tmp_path, build([], scalar_q)[0], "q.shape")


def test_open_does_not_import_numpy(smollm2):
    """Opening (as reflex inspect does) stays numpy-free; the split walk is used."""
    code = ("import sys\n"
            "from reflex_ipc.gguffile import GGUFFile\n"
            "f = GGUFFile(sys.argv[1])\n"
            "t = f.metadata['tokenizer.ggml.tokens']\n"
            "assert t.count > 2048 and type(t.lengths) is list, t\n"
            "assert 'numpy' not in sys.modules\n"
            "print(len(t.raw_strings()))\n")
    out = subprocess.run([sys.executable, "-c", code, smollm2], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 49152


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")


# -- fuzzing -----------------------------------------------------------------------------------

FUZZ_DIR = tempfile.mkdtemp(prefix="reflex-gguf-fuzz-")
BASE, LAYOUT = base_file()
KINDS = sorted({k for k, _, _ in LAYOUT})
INTERESTING = [0, 1, 2, 7, 8, 31, 32, 255, 256, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
               2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1, len(BASE), len(BASE) - 1, len(BASE) + 1]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def check_parses_or_gguf_error(data):
    """The fuzz oracle: parse fully (and touch everything) or raise GGUFError with a location."""
    path = os.path.join(FUZZ_DIR, "f.gguf")
    write(path, data)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(5)
    try:
        try:
            f = GGUFFile(path)
        except GGUFError as e:
            assert e.field is not None or e.offset is not None, e
            return "error"
        with f:
            for key, v in f.metadata.items():
                f.get(key)
                if isinstance(v, ArrayValue) and v.elem_type in gguffile._NP_DTYPE:
                    assert len(v.numpy()) == v.count
            for t in f.tensors.values():
                assert len(f.tensor_data(t)) == t.nbytes
                assert f.data_offset <= t.offset and t.offset + t.nbytes <= f.size
        return "ok"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_fuzz_base_parses():
    assert check_parses_or_gguf_error(BASE) == "ok"


@pytest.mark.parametrize("kind", KINDS)
def test_truncate_in_every_region(kind):
    for _, off, size in [x for x in LAYOUT if x[0] == kind][:3]:
        for cut in {off, off + size // 2, off + size - 1, off + size}:
            if 0 <= cut < len(BASE):
                check_parses_or_gguf_error(BASE[:cut])


FUZZ = settings(max_examples=500, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(cut=st.integers(0, len(BASE)))
def test_fuzz_truncation(cut):
    outcome = check_parses_or_gguf_error(BASE[:cut])
    assert outcome == "error" or cut == len(BASE)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(BASE) - 1), st.integers(0, 7)),
                      min_size=1, max_size=8))
def test_fuzz_bit_flips(flips):
    data = bytearray(BASE)
    for pos, bit in flips:
        data[pos] ^= 1 << bit
    check_parses_or_gguf_error(bytes(data))


@FUZZ
@given(kind=st.sampled_from([k for k in KINDS if k not in ("tensor.data",)]),
       nth=st.integers(0, 10**6), value=st.one_of(st.sampled_from(INTERESTING),
                                                  st.integers(0, 2**64 - 1)))
def test_fuzz_patched_fields(kind, nth, value):
    fields = [(off, size) for k, off, size in LAYOUT if k == kind]
    off, size = fields[nth % len(fields)]
    if size not in (1, 2, 4, 8):  # string bytes: overwrite the start with the value's bytes
        raw = value.to_bytes(8, "little")[:size]
    else:
        raw = (value % (1 << (8 * size))).to_bytes(size, "little")
    data = BASE[:off] + raw + BASE[off + len(raw):]
    check_parses_or_gguf_error(data)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 64))
def test_fuzz_random_garbage_after_header(seed, n):
    rng = np.random.default_rng(seed)
    header = b"GGUF" + struct.pack("<IQQ", 3, int(rng.integers(0, 4)), int(rng.integers(0, 8)))
    check_parses_or_gguf_error(header + rng.integers(0, 256, n * 8, dtype=np.uint8).tobytes())
